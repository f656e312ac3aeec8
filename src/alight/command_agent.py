"""Agents in any language: `agent.command` runs a program once per attempt.

    agent:
      command: ["node", "examples/node_agent/agent.js"]   # or a string, split like a shell does
      name: calc

The command is checked where the config is loaded (the executable must exist) and runs in the
directory alight was started from, so relative paths in it are relative to that directory, as
`agent.entrypoint` file paths are. `python` or `python3` as its program is the interpreter running
alight, not the PATH's (kind docker: the image's); name another to use it. Each attempt starts the
program in a session of its own with the task as JSON on stdin and in the file `ALIGHT_TASK_FILE`,
and with these variables (besides the runner's own environment):

    OPENAI_BASE_URL / OPENAI_API_KEY        the proxy route of this attempt and agent (.../v1)
    ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY  the same route without /v1
    ALIGHT_MODEL                            the model name to send
    ALIGHT_ROLLOUT_ID, ALIGHT_ATTEMPT_ID, ALIGHT_AGENT_NAME, ALIGHT_TRACE_ID, ALIGHT_PARENT_SPAN_ID
    ALIGHT_TASK_FILE, ALIGHT_REWARD_FILE    the task's JSON; where the program may write its reward
    ALIGHT_STORE_URL                        the store server, for spans the program posts itself

The base URL names the agent and its AGENT span in its path, so the program's LLM calls nest under
the agent span with the agent's name although it sends no alight header. The reward is what the
program wrote to `ALIGHT_REWARD_FILE` (a number or `{"reward": x}`), else the last line of its
stdout that is a number or a JSON object with a "reward"; with neither, the last of the reward
spans the program posted to the store itself (`POST {ALIGHT_STORE_URL}/store/spans`; when the
store has a token, with its attempt's key `OPENAI_API_KEY` as bearer, which the store accepts only
with `runner.agent_spans`; numbered as they arrive, so intermediate rewards keep their place among
the LLM calls), as for a Python agent that emits its rewards. The program never gets the runner's
own credentials (`ALIGHT_TOKEN`, `ALIGHT_RUNNER_CREDENTIAL`). A non-zero exit
fails the attempt with the end of the program's stderr; when the attempt times out or is
cancelled, the program and everything it started in its session are killed.

With `agent.sandbox` (alight.sandbox; kind local or docker, or a `workdir`, or reward.kind=tests)
each attempt runs in a sandbox instead: cwd = a fresh working copy (a copy of the task's
`agent.sandbox.workdir` folder), the environment cleared to PATH, LANG, HOME (= the working copy)
and the variables above, the task and reward files in a private folder, and only the proxy and the
store reachable (kind local/docker). With `reward.kind: tests` the reward is the share of the hidden
tests that pass in the working copy after the program (alight.rewards.tests).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alight import semconv
from alight.agent import LLM, AgentFailure, LitAgent
from alight.config.schema import RewardConfig, SandboxConfig
from alight.errors import ConfigError
from alight.rewards.kinds import reward_kind
from alight.rewards.tests import check_hidden, check_tests_reward, reward_from_tests
from alight.sandbox.base import (
    RunResult,
    Sandbox,
    SandboxError,
    task_folder,
    with_alight_python,
    with_alight_python_path,
)
from alight.sandbox.factory import check_sandbox, isolates, open_sandbox, sandbox_class, sandbox_environment
from alight.sandbox.process import run_process
from alight.tracing.context import current_attempt, current_frame
from alight.types import Attempt, Rollout, SpanKind

logger = logging.getLogger(__name__)

#: Variables of the runner's environment a program never gets: the admin token, a runner credential.
RUNNER_SECRETS = frozenset({"ALIGHT_TOKEN", "ALIGHT_RUNNER_CREDENTIAL"})
#: How much of the end of a failed program's stderr the attempt's error keeps.
STDERR_TAIL_BYTES = 2048
#: Longest stdout line read as a possible reward; longer lines are skipped.
MAX_REWARD_LINE_BYTES = 1 << 16


class CommandAgent(LitAgent):
    """An agent that runs `command` (a program in any language) once per attempt; see the module
    docstring for what the program gets and how its reward is read. Picklable, so it travels to
    pool workers and Ray actors as it is. A bad command raises a one-line ConfigError."""

    def __init__(
        self,
        command: str | Sequence[str],
        name: str | None = None,
        *,
        cwd: str | Path | None = None,
        sandbox: SandboxConfig | None = None,
        reward: RewardConfig | None = None,
    ) -> None:
        self.cwd = str(Path(cwd if cwd is not None else Path.cwd()).expanduser().resolve())
        self.reward = reward
        self.tests = (
            reward.tests if reward is not None and reward_kind(reward).runs_in_sandbox else None
        )  # they give it
        self.sandbox = sandbox if sandbox is not None or self.tests is None else SandboxConfig()
        where = sandbox_class(self.sandbox.kind) if self.sandbox is not None else None
        self.command = _checked_command(command, self.cwd, where)
        self.time_s = self.sandbox.time_s if self.sandbox is not None else None
        if self.sandbox is not None:  # cwd becomes the working copy: the script's path must not depend on it
            self.command[1:] = [_absolute(part, self.cwd) for part in self.command[1:]]
        super().__init__(name or _default_name(self.command, self.cwd))
        if "/" in self.name or not self.name.strip():
            raise ConfigError(f"agent.name {self.name!r}: a command agent's name must be non-empty, without '/'")

    def __repr__(self) -> str:
        return f"CommandAgent({shlex.join(self.command)!r}, name={self.name!r})"

    async def rollout(self, task: Any, llm: LLM | None, rollout: Rollout, attempt: Attempt | None) -> float | None:
        """Run the program on `task`; its reward (None when it posted its rewards itself)."""
        attempt_id = attempt.attempt_id if attempt is not None else ""
        variables = self.environment(llm, rollout.rollout_id, attempt_id)
        if self.sandbox is None:
            with tempfile.TemporaryDirectory(prefix="alight-command-") as folder:
                env = {k: v for k, v in os.environ.items() if k not in RUNNER_SECRETS}  # the runner's own keys stay
                env = with_alight_python_path(env, None)
                return await self._attempt(task, env | variables, Path(folder), self._run_here)
        allow = [url for url in (variables.get("OPENAI_BASE_URL"), variables.get("ALIGHT_STORE_URL")) if url]
        try:
            source = task_folder(task, self.sandbox.workdir, Path(self.cwd), "agent.sandbox.workdir")
            async with open_sandbox(self.sandbox, source=source, allow=allow) as box:
                if self.tests is not None:
                    check_hidden(box, self.tests, task, Path(self.cwd), self.command)
                env = sandbox_environment(box, variables)
                reward = await self._attempt(task, env, box.private, functools.partial(box.run, timeout_s=self.time_s))
                if self.tests is not None:
                    return await reward_from_tests(box, self.tests, task, Path(self.cwd))
                return reward
        except SandboxError as err:
            raise AgentFailure(f"agent {self.name}: {err}") from None

    async def _attempt(
        self, task: Any, env: dict[str, str], folder: Path, run: Callable[..., Awaitable[RunResult]]
    ) -> float | None:
        """Write the task, run the program with `run`, and read its reward (see the module docstring)."""
        task_json = json.dumps(task, default=str)
        task_file, reward_file = folder / "task.json", folder / "reward"
        task_file.write_text(task_json)
        env.update(ALIGHT_TASK_FILE=str(task_file), ALIGHT_REWARD_FILE=str(reward_file))
        lines = _RewardLines()
        result = await run(self.command, env=env, stdin=task_json.encode() + b"\n", stdout=lines.add)
        if result.timed_out:
            raise AgentFailure(f"agent {self.name}: ran past agent.sandbox.time_s={self.time_s}s and was killed")
        if result.code != 0:
            raise AgentFailure(self._failure(result.code, result.stderr_tail[-STDERR_TAIL_BYTES:]))
        written = reward_file.read_text(errors="replace").strip() if reward_file.is_file() else ""
        if written:
            reward = parse_reward(written)
            if reward is None:
                raise AgentFailure(f"agent {self.name}: ALIGHT_REWARD_FILE holds {written[:80]!r}, not a reward")
            return reward
        if lines.reward is None and reward_kind(self.reward).agent_gives_reward:
            await _adopt_posted_reward(*(env.get(k, "") for k in ("ALIGHT_ROLLOUT_ID", "ALIGHT_ATTEMPT_ID")))
        return lines.reward

    async def _run_here(self, argv: Sequence[str], **options: Any) -> RunResult:
        """No sandbox: the program runs in alight's directory with the runner's environment."""
        try:
            return await run_process(argv, cwd=self.cwd, name=f"{self.name}", **options)
        except SandboxError as err:
            raise AgentFailure(f"agent {self.name}: {err}") from None

    def environment(self, llm: LLM | None, rollout_id: str, attempt_id: str) -> dict[str, str]:
        """The variables the program gets for one attempt (without the task and reward files)."""
        env = {"ALIGHT_ROLLOUT_ID": rollout_id, "ALIGHT_ATTEMPT_ID": attempt_id, "ALIGHT_AGENT_NAME": self.name}
        frame = current_frame()
        parent = frame.parent if frame is not None else None
        if parent is not None:
            env.update(ALIGHT_TRACE_ID=parent.trace_id, ALIGHT_PARENT_SPAN_ID=parent.span_id)
        attempt_context = current_attempt()
        store_url = getattr(attempt_context.store, "url", None) if attempt_context is not None else None
        if isinstance(store_url, str):
            env["ALIGHT_STORE_URL"] = store_url
        if llm is not None:
            route = llm.base_url.rstrip("/").removesuffix("/v1")
            if parent is not None and frame is not None:
                # The agent and its span ride in the path: the proxy records them as it records the headers.
                route += f"/agent/{quote(frame.agent_name, safe='')}/trace/{parent.trace_id}/span/{parent.span_id}"
            env.update(
                OPENAI_BASE_URL=f"{route}/v1",
                OPENAI_API_KEY=llm.api_key,
                ANTHROPIC_BASE_URL=route,
                ANTHROPIC_API_KEY=llm.api_key,
                ALIGHT_MODEL=llm.model,
            )
        return env

    def _failure(self, code: int, stderr_tail: bytes) -> str:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        text = stderr_tail.decode(errors="replace").rstrip()
        tail = f"; the end of its stderr:\n{text}" if text else " (nothing on stderr)"
        return f"agent {self.name}: {shlex.join(self.command)} {how}{tail}"


def command_agent(
    command: Any, name: str | None = None, *, sandbox: SandboxConfig | None = None, reward: RewardConfig | None = None
) -> CommandAgent:
    """The agent of a config's `agent.command`: a list of arguments (numbers become text), or a
    string split like a shell splits it. ConfigError, in one line, for anything else. `sandbox`
    (agent.sandbox) is used when it isolates, names a workdir, or `reward` (reward) is kind tests."""
    if sandbox is not None and not uses_sandbox(sandbox, reward):
        sandbox = None
    options: dict[str, Any] = {"sandbox": sandbox, "reward": reward}
    if isinstance(command, str):
        return CommandAgent(command, name, **options)
    parts: list[str] = []
    if not isinstance(command, Mapping | bytes) and hasattr(command, "__iter__"):  # a list, an OmegaConf ListConfig
        parts = [str(part) for part in command if isinstance(part, str | int | float) and not isinstance(part, bool)]
        if len(parts) == len(list(command)):
            return CommandAgent(parts, name, **options)
    raise ConfigError(f"agent.command must be a list of strings or a string, got {command!r}")


def check_command_agent(command: Any, sandbox: SandboxConfig, reward: RewardConfig) -> None:
    """One-line ConfigErrors, at config load, for a sandbox or a tests reward this machine cannot run."""
    if reward_kind(reward).runs_in_sandbox:
        check_tests_reward(reward.tests, command)
    if command is not None and uses_sandbox(sandbox, reward):
        check_sandbox(sandbox)


def uses_sandbox(sandbox: SandboxConfig, reward: RewardConfig | None) -> bool:
    """Whether a command agent's attempts run in `sandbox`: when its kind isolates (local, docker),
    it names a working copy, or the reward comes from tests run in that copy."""
    return isolates(sandbox.kind) or sandbox.workdir is not None or reward_kind(reward).runs_in_sandbox


def parse_reward(text: str) -> float | None:
    """The reward `text` states: a number or a JSON object with a numeric "reward"; None otherwise.
    AgentFailure for a reward that is not a finite number."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        if "reward" not in value:
            return None
        value = value["reward"]
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        raise AgentFailure(f"the program's reward {value!r} is not a finite number")
    return float(value)


async def _adopt_posted_reward(rollout_id: str, attempt_id: str) -> None:
    """Make the last reward span the program posted to the store itself the attempt's reward, as
    `emit_reward` does for Python agents (the span is there already: none is added)."""
    context = current_attempt()
    if context is None or not attempt_id:
        return
    spans = await context.store.query_spans(rollout_id, attempt_id)
    posted = [
        s
        for s in spans
        if s.kind is SpanKind.REWARD and isinstance(s.attributes.get(semconv.REWARD_VALUE), int | float)
    ]
    if posted:
        context.rewards.append(float(posted[-1].attributes[semconv.REWARD_VALUE]))


# -- the command ---------------------------------------------------------------------------------


def _checked_command(command: str | Sequence[str], cwd: str, sandbox: type[Sandbox] | None) -> list[str]:
    """The command's arguments, `python` as its program being alight's own (`with_alight_python`)."""
    if isinstance(command, str):
        try:
            parts = shlex.split(command)
        except ValueError as err:
            raise ConfigError(f"agent.command {command!r} does not parse: {err}") from None
    else:
        parts = list(command)
    if not parts or not all(isinstance(part, str) for part in parts) or not parts[0]:
        raise ConfigError(f"agent.command must name a program (a non-empty list of strings), got {command!r}")
    parts = with_alight_python(parts, sandbox)
    executable = parts[0]
    if "/" in executable:
        path = Path(cwd, executable).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"agent.command: {executable} is not an executable file (relative to {cwd})")
        # Absolute (Ray actors on this machine run elsewhere), not resolved: a venv's python stays the venv's.
        parts[0] = str(path.absolute())
    elif shutil.which(executable) is None:
        raise ConfigError(f"agent.command: executable {executable!r} not found on PATH")
    return parts


def _absolute(part: str, cwd: str) -> str:
    """`part` as an absolute path when it names a file relative to `cwd` (a script), else as it is."""
    if part.startswith("-") or os.path.isabs(part) or not Path(cwd, part).is_file():
        return part
    return str(Path(cwd, part).resolve())


def _default_name(command: list[str], cwd: str) -> str:
    """The stem of the first argument that names a file (the script), else of the executable."""
    for part in command[1:]:
        if not part.startswith("-") and Path(cwd, part).is_file():
            return Path(part).stem
    return Path(command[0]).stem


# -- the process ---------------------------------------------------------------------------------


class _RewardLines:
    """Splits stdout into lines as it arrives, keeping the last one that states a reward."""

    def __init__(self) -> None:
        self.reward: float | None = None
        self._partial = bytearray()
        self._skipping = False  # inside a line too long to be a reward

    def add(self, chunk: bytes) -> None:
        if not chunk:  # end of the stream: the last line may lack its newline
            self._line(bytes(self._partial))
            self._partial.clear()
            return
        *lines, rest = chunk.split(b"\n")
        for line in lines:
            self._partial += line
            self._line(bytes(self._partial))
            self._partial.clear()
            self._skipping = False
        self._partial += rest
        if len(self._partial) > MAX_REWARD_LINE_BYTES:
            self._partial.clear()
            self._skipping = True

    def _line(self, line: bytes) -> None:
        if self._skipping or not line.strip():
            return
        try:
            reward = parse_reward(line.decode(errors="replace").strip())
        except AgentFailure:  # a "reward" of NaN: what the program meant is unclear, so it is not one
            logger.warning("command agent: ignoring a non-finite reward line on stdout: %r", line[:80])
            return
        if reward is not None:
            self.reward = reward


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
