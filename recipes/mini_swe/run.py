"""Run mini-swe-agent, unchanged, as alight's command agent on one SWE-style task.

alight starts this once per attempt (`agent.command` in configs/mini_swe.yaml) in the attempt's
working copy (the task's repository, `agent.sandbox.workdir: repo`), with the task's JSON in
`ALIGHT_TASK_FILE` and the attempt's route in `OPENAI_BASE_URL`/`OPENAI_API_KEY`/`ALIGHT_MODEL`.
It runs mini-swe-agent's own command line, `mini` (`python -m minisweagent.run.mini`), on the
task's `problem_statement`, non-interactive (`--yolo --exit-immediately`), with mini's config
`mini_swe.yaml` beside this file and only these set from outside: the model (LiteLLM's
`openai/<ALIGHT_MODEL>` at `api_base = OPENAI_BASE_URL`; LiteLLM reads the key from
`OPENAI_API_KEY`), cost tracking off, the step limit. mini's console goes to stderr, so nothing on
stdout reads as a reward: the hidden tests decide it (`reward.kind: tests`). The driver exits 0
when mini ended the episode itself (AGENT_ENDINGS, read from its trajectory), else with mini's code.

    python recipes/mini_swe/run.py --step-limit 8      # in a repository, with the variables above
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MINI_CONFIG = HERE / "mini_swe.yaml"
#: mini's exit statuses that end an episode as the agent left it (its edits are scored by the hidden
#: tests): it submitted, ran out of steps or time, kept answering out of format, or filled the model's
#: context. Any other ending (the proxy unreachable, a crash) fails the attempt, which alight retries.
AGENT_ENDINGS = frozenset(
    {"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError", "ContextWindowExceededError"}
)
#: Fields of a task row that may hold the issue text, in order (SWE-bench's first).
PROBLEM_FIELDS = ("problem_statement", "question", "task", "prompt")


class UsageError(Exception):
    """What the driver was given is wrong: one line on stderr, exit code 2."""


def problem_statement(task: Any) -> str:
    """The issue text of a task row (or the task itself when it is text)."""
    if isinstance(task, str) and task.strip():
        return task
    if isinstance(task, dict):
        for key in PROBLEM_FIELDS:
            if isinstance(task.get(key), str) and task[key].strip():
                return str(task[key])
    raise UsageError(f"the task has no problem statement (one of {', '.join(PROBLEM_FIELDS)})")


def mini_command(problem: str, *, model: str, base_url: str, step_limit: int, config: Path, output: Path) -> list[str]:
    """mini's command line: its CLI unchanged, our config file plus the settings made from outside."""
    return [
        sys.executable,
        "-m",
        "minisweagent.run.mini",
        "--yolo",
        "--exit-immediately",
        "-c",
        str(config),
        "-c",
        f"agent.step_limit={step_limit}",
        "-c",
        "agent.cost_limit=0",
        "-c",
        "model.cost_tracking=ignore_errors",
        "-c",
        f"model.model_kwargs.api_base={json.dumps(base_url)}",
        "-m",
        f"openai/{model}",
        "-t",
        problem,
        "-o",
        str(output),
    ]


def mini_environment(config_dir: Path, retries: int) -> dict[str, str]:
    """The attempt's environment, plus what keeps mini quiet, offline and non-interactive."""
    return os.environ | {
        "MSWEA_CONFIGURED": "1",  # skip mini's first-run setup prompt
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),  # its .env and trajectory: not the user's home
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(retries),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its price list at import
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-limit", type=int, default=10, help="model calls mini may make")
    parser.add_argument("--retries", type=int, default=2, help="tries of one model call")
    parser.add_argument("--config", type=Path, default=MINI_CONFIG, help="mini-swe-agent's config file")
    parser.add_argument("--trajectory", type=Path, default=None, help="keep mini's trajectory here")
    args = parser.parse_args(argv)
    try:
        if args.step_limit < 1 or args.retries < 1:
            raise UsageError("--step-limit and --retries must be at least 1")
        if importlib.util.find_spec("minisweagent") is None:
            raise UsageError('mini-swe-agent is not installed: pip install "alight[mini-swe]"')
        if not args.config.is_file():
            raise UsageError(f"--config {args.config}: no such file")
        missing = [k for k in ("ALIGHT_TASK_FILE", "OPENAI_BASE_URL", "ALIGHT_MODEL") if not os.environ.get(k)]
        if missing:
            raise UsageError(f"not run by alight: {', '.join(missing)} unset")
        try:
            task = json.loads(Path(os.environ["ALIGHT_TASK_FILE"]).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the task file: {exc}") from None
        problem = problem_statement(task)
    except UsageError as exc:
        print(f"mini_swe: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mini-swe-") as scratch:
        output = args.trajectory or Path(scratch) / "trajectory.json"
        command = mini_command(
            problem,
            model=os.environ["ALIGHT_MODEL"],
            base_url=os.environ["OPENAI_BASE_URL"],
            step_limit=args.step_limit,
            config=args.config,
            output=output,
        )
        env = mini_environment(Path(scratch), args.retries)
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sys.stderr, env=env, check=False)
        status = exit_status(output)
        print(f"mini_swe: mini exited {done.returncode}, exit status {status!r}", file=sys.stderr)
        return 0 if status in AGENT_ENDINGS else done.returncode or 1


def exit_status(trajectory: Path) -> str | None:
    """The exit status mini saved in its trajectory file (None without one)."""
    try:
        info = json.loads(trajectory.read_text(encoding="utf-8")).get("info", {})
    except (OSError, ValueError, AttributeError):
        return None
    status = info.get("exit_status") if isinstance(info, dict) else None
    return str(status) if status else None


if __name__ == "__main__":
    sys.exit(main())
