"""Agents in any language: `agent.command` runs a program once per attempt.

    agent:
      command: ["node", "examples/node_agent/agent.js"]   # or a string, split like a shell does
      name: calc

The command is checked where the config is loaded (the executable must exist) and runs in the
directory alight was started from, so relative paths in it are relative to that directory, as
`agent.entrypoint` file paths are. Each attempt starts the program in a session of its own with
the task as JSON on stdin and in the file `ALIGHT_TASK_FILE`, and with these variables (besides the
runner's own environment):

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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alight import semconv
from alight.agent import LLM, AgentFailure, LitAgent
from alight.errors import ConfigError
from alight.tracing.context import current_attempt, current_frame
from alight.types import Attempt, Rollout, SpanKind

logger = logging.getLogger(__name__)

#: Variables of the runner's environment a program never gets: the admin token, a runner credential.
RUNNER_SECRETS = frozenset({"ALIGHT_TOKEN", "ALIGHT_RUNNER_CREDENTIAL"})
#: How much of the end of a failed program's stderr the attempt's error keeps.
STDERR_TAIL_BYTES = 2048
#: Longest stdout line read as a possible reward; longer lines are skipped.
MAX_REWARD_LINE_BYTES = 1 << 16
#: How long to wait for the program's pipes to close after it (and its session) ended.
PIPE_DRAIN_S = 5.0
_READ_CHUNK = 1 << 16


class CommandAgent(LitAgent):
    """An agent that runs `command` (a program in any language) once per attempt; see the module
    docstring for what the program gets and how its reward is read. Picklable, so it travels to
    pool workers and Ray actors as it is. A bad command raises a one-line ConfigError."""

    def __init__(self, command: str | Sequence[str], name: str | None = None, *, cwd: str | Path | None = None) -> None:
        self.cwd = str(Path(cwd if cwd is not None else Path.cwd()).expanduser().resolve())
        self.command = _checked_command(command, self.cwd)
        super().__init__(name or _default_name(self.command, self.cwd))
        if "/" in self.name or not self.name.strip():
            raise ConfigError(f"agent.name {self.name!r}: a command agent's name must be non-empty, without '/'")

    def __repr__(self) -> str:
        return f"CommandAgent({shlex.join(self.command)!r}, name={self.name!r})"

    async def rollout(self, task: Any, llm: LLM | None, rollout: Rollout, attempt: Attempt | None) -> float | None:
        """Run the program on `task`; its reward (None when it posted its rewards itself)."""
        attempt_id = attempt.attempt_id if attempt is not None else ""
        with tempfile.TemporaryDirectory(prefix="alight-command-") as folder:
            task_json = json.dumps(task, default=str)
            task_file = Path(folder) / "task.json"
            task_file.write_text(task_json)
            reward_file = Path(folder) / "reward"
            env = {k: v for k, v in os.environ.items() if k not in RUNNER_SECRETS}  # the runner's own keys stay
            env.update(self.environment(llm, rollout.rollout_id, attempt_id))
            env.update(ALIGHT_TASK_FILE=str(task_file), ALIGHT_REWARD_FILE=str(reward_file))
            code, stdout_reward, stderr_tail = await self._run(env, task_json.encode() + b"\n")
            if code != 0:
                raise AgentFailure(self._failure(code, stderr_tail))
            written = reward_file.read_text(errors="replace").strip() if reward_file.is_file() else ""
        if written:
            reward = parse_reward(written)
            if reward is None:
                raise AgentFailure(f"agent {self.name}: ALIGHT_REWARD_FILE holds {written[:80]!r}, not a reward")
            return reward
        if stdout_reward is None:
            await _adopt_posted_reward(rollout.rollout_id, attempt_id)
        return stdout_reward

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

    async def _run(self, env: Mapping[str, str], stdin: bytes) -> tuple[int, float | None, bytes]:
        """Run the program to its end: (exit code, last stdout reward, stderr tail). Cancelled (the
        attempt timed out or was stopped): its whole session is killed before this returns."""
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env=dict(env),
                start_new_session=True,  # its own process group: killing it reaches what it started
            )
        except OSError as err:
            raise AgentFailure(f"agent {self.name}: cannot start {shlex.join(self.command)}: {err}") from None
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        stdout, stderr = _RewardLines(), _Tail(STDERR_TAIL_BYTES)
        pipes = asyncio.gather(
            _feed(process.stdin, stdin),
            _drain(process.stdout, stdout.add),
            _drain(process.stderr, stderr.add, log=f"{self.name} stderr"),
        )
        try:
            code = await _exit_code(process)
            _kill_session(process.pid)  # what it left running would hold its pipes open, and is ours to end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipes), PIPE_DRAIN_S)
        finally:
            if process.returncode is None:
                _kill_session(process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.shield(_exit_code(process))
            if not pipes.done():
                pipes.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pipes
        return code, stdout.reward, stderr.text()

    def _failure(self, code: int, stderr_tail: bytes) -> str:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        text = stderr_tail.decode(errors="replace").rstrip()
        tail = f"; the end of its stderr:\n{text}" if text else " (nothing on stderr)"
        return f"agent {self.name}: {shlex.join(self.command)} {how}{tail}"


def command_agent(command: Any, name: str | None = None) -> CommandAgent:
    """The agent of a config's `agent.command`: a list of arguments (numbers become text), or a
    string split like a shell splits it. ConfigError, in one line, for anything else."""
    if isinstance(command, str):
        return CommandAgent(command, name)
    parts: list[str] = []
    if not isinstance(command, Mapping | bytes) and hasattr(command, "__iter__"):  # a list, an OmegaConf ListConfig
        parts = [str(part) for part in command if isinstance(part, str | int | float) and not isinstance(part, bool)]
        if len(parts) == len(list(command)):
            return CommandAgent(parts, name)
    raise ConfigError(f"agent.command must be a list of strings or a string, got {command!r}")


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


def _checked_command(command: str | Sequence[str], cwd: str) -> list[str]:
    if isinstance(command, str):
        try:
            parts = shlex.split(command)
        except ValueError as err:
            raise ConfigError(f"agent.command {command!r} does not parse: {err}") from None
    else:
        parts = list(command)
    if not parts or not all(isinstance(part, str) for part in parts) or not parts[0]:
        raise ConfigError(f"agent.command must name a program (a non-empty list of strings), got {command!r}")
    executable = parts[0]
    if "/" in executable:
        path = Path(cwd, executable).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"agent.command: {executable} is not an executable file (relative to {cwd})")
        parts[0] = str(path.resolve())  # Ray actors on this machine run elsewhere
    elif shutil.which(executable) is None:
        raise ConfigError(f"agent.command: executable {executable!r} not found on PATH")
    return parts


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


class _Tail:
    """The last `size` bytes of a stream."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > 4 * self.size:
            del self._data[: -self.size]

    def text(self) -> bytes:
        return bytes(self._data[-self.size :])


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    """Write the task to the program's stdin and close it; a program that never reads it is fine."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()


async def _drain(stream: asyncio.StreamReader, sink: Any, log: str | None = None) -> None:
    """Read `stream` to its end, chunk by chunk, into `sink` (so a chatty program never blocks)."""
    while True:
        chunk = await stream.read(_READ_CHUNK)
        sink(chunk)
        if not chunk:
            return
        if log is not None and logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: %s", log, chunk.decode(errors="replace").rstrip())


async def _exit_code(process: asyncio.subprocess.Process) -> int:
    """The program's exit code once it has exited. Not `process.wait()`: that also waits for its
    pipes to close, which a child it left running may hold open."""
    delay = 0.005
    while process.returncode is None:
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.05)
    return process.returncode


def _kill_session(pid: int) -> None:
    """SIGKILL the process group the program leads (it and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
