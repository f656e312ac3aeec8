"""What the coding-agent harness recipes (codex_cli, claude_code) share: the prompt they make from
an SWE-style task, and the driver that runs a harness CLI once per attempt.

`drive` reads the task from ALIGHT_TASK_FILE, checks that alight set the variables the harness needs,
makes a private home directory (the harness reads and writes no user config), lets the recipe write
its files there and build the command line and environment, runs the harness in the current
directory (the attempt's working copy) with no stdin, and returns its exit status. The harness's
output (stdout and stderr) goes to stderr, so nothing the model writes is read as a reward: the
hidden tests decide it. A harness that ends because the model's answer was cut at max_tokens (a
line of its output matches the recipe's `cut` pattern) ends the episode as the agent left it:
exit 0, so the hidden tests score the working copy and the calls made are trained on; any other
failure (the model unreachable, a crash) keeps the harness's non-zero status.
Bad input (no task, no issue text, a variable missing, the CLI not installed) is one line on stderr
and exit status 2. Standard library only: drivers run under any python3 inside the sandbox.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPT = """Resolve this issue in the Python repository in the current directory:

{issue}

Change the repository's code in place so that the issue is fixed. Leave the tests alone."""

#: (the CLI, the prompt, alight's environment, the private home, the driver's options: `instructions`,
#: the system prompt file or None; `max_output_tokens`, an int or None) -> (argv, environment)
Launch = Callable[[str, str, dict[str, str], str, argparse.Namespace], tuple[list[str], dict[str, str]]]


def prompt_of(task: Any) -> str:
    """The prompt a harness gets: the task's issue text (SWE-bench's `problem_statement`)."""
    issue = task.get("problem_statement") if isinstance(task, dict) else None
    if not isinstance(issue, str) or not issue.strip():
        raise ValueError("the task has no problem_statement (the issue text)")
    return PROMPT.format(issue=issue.strip())


def drive(
    name: str, program: str, install_dir: str, needs: tuple[str, ...], launch: Launch, cut: re.Pattern[str]
) -> int:
    """Run the harness `program` (under `install_dir`/node_modules/.bin) on the attempt's task;
    `cut`: the line the harness prints when it stops on an answer cut at max_tokens."""
    parser = argparse.ArgumentParser(prog=name, description=f"{name}: run the harness on one task")
    parser.add_argument("--install-dir", default=install_dir, help="where the recipe's install.sh put the CLI")
    parser.add_argument(
        "--instructions",
        help="a file whose text replaces the harness's own system prompt (for small models); default: its own",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        help="the most tokens the harness asks for in one answer (Claude Code asks for 32,000 by default;"
        " Codex asks for none, so the engine's max_tokens applies); default: its own",
    )
    args = parser.parse_args()
    cli = Path(args.install_dir).expanduser() / "node_modules" / ".bin" / program
    missing = [variable for variable in ("ALIGHT_TASK_FILE", *needs) if not os.environ.get(variable)]
    if missing:
        return _refuse(name, f"{', '.join(missing)} not set (alight sets them for a command agent)")
    try:
        prompt = prompt_of(json.loads(Path(os.environ["ALIGHT_TASK_FILE"]).read_text()))
    except (OSError, ValueError) as err:
        return _refuse(name, f"bad task: {err}")
    if args.instructions is not None and not Path(args.instructions).is_file():
        return _refuse(name, f"--instructions {args.instructions}: no such file")
    if args.max_output_tokens is not None and args.max_output_tokens < 1:
        return _refuse(name, f"--max-output-tokens {args.max_output_tokens}: not a positive number")
    if not cli.is_file():  # after the arguments: a bad option is named whether or not the CLI is installed
        return _refuse(name, f"no {program} at {cli}: run recipes/{name}/install.sh")
    args.instructions = str(Path(args.instructions).resolve()) if args.instructions else None
    with tempfile.TemporaryDirectory(prefix=f"alight-{name}-home-") as home:
        argv, env = launch(str(cli), prompt, dict(os.environ), home, args)
        code, was_cut = _run(argv, env, cut)
    if code != 0 and was_cut:
        print(f"{name}: the model's answer was cut at max_tokens: the episode ends here", file=sys.stderr)
        return 0
    return code


def _run(argv: list[str], env: dict[str, str], cut: re.Pattern[str]) -> tuple[int, bool]:
    """Run the harness, its output (stdout and stderr) copied to stderr line by line: (its exit
    status, whether a line of it matched `cut`)."""
    was_cut = False
    with subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as harness:
        assert harness.stdout is not None
        for raw in harness.stdout:
            sys.stderr.buffer.write(raw)
            sys.stderr.flush()
            was_cut = was_cut or cut.fullmatch(raw.decode(errors="replace").rstrip("\r\n")) is not None
    return harness.returncode, was_cut


def _refuse(name: str, why: str) -> int:
    print(f"{name}: {why}", file=sys.stderr)
    return 2
