"""Running one program to its end in a process group of its own, killing the group after it.

Shared by every backend: the program is the agent's command itself (kind none), or the `unshare` /
`docker` that wraps it. Its stdout goes to a sink chunk by chunk (so a chatty program never blocks)
and its tails are kept; on timeout or cancellation the whole process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import resource
import signal
from collections.abc import Callable, Mapping, Sequence

from alight.sandbox.namespace_init import start_failure
from alight.sandbox.result import TAIL_BYTES, RunResult, SandboxError, Sink

logger = logging.getLogger(__name__)

#: How long to wait for the program's pipes to close after it (and its group) ended.
PIPE_DRAIN_S = 5.0
_READ_CHUNK = 1 << 16


async def run_process(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdin: bytes = b"",
    timeout_s: float | None = None,
    stdout: Sink | None = None,
    name: str = "command",
    preexec: Callable[[], None] | None = None,
) -> RunResult:
    """Run `argv` to its end (or `timeout_s`): its RunResult. Cancelled: its whole process group is
    killed before this returns. A program that cannot start: SandboxError."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # its own process group: killing it reaches what it started
            preexec_fn=preexec,
        )
    except OSError as err:
        raise SandboxError(start_failure(argv[0], env, cwd, err)) from None
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    out, err_tail = Tail(TAIL_BYTES), Tail(TAIL_BYTES)

    def on_stdout(chunk: bytes) -> None:
        out.add(chunk)
        if stdout is not None:
            stdout(chunk)

    pipes = asyncio.gather(
        _feed(process.stdin, stdin),
        _drain(process.stdout, on_stdout),
        _drain(process.stderr, err_tail.add, log=f"{name} stderr"),
    )
    timed_out = False
    try:
        try:
            code = await asyncio.wait_for(exit_code(process), timeout_s)
        except TimeoutError:
            timed_out = True
            kill_group(process.pid)
            code = await exit_code(process)
        kill_group(process.pid)  # what it left running would hold its pipes open, and is ours to end
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pipes), PIPE_DRAIN_S)
    finally:
        if process.returncode is None:
            kill_group(process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.shield(exit_code(process))
        if not pipes.done():
            pipes.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pipes
    return RunResult(code, out.text(), err_tail.text(), timed_out)


class Tail:
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


async def _drain(stream: asyncio.StreamReader, sink: Sink, log: str | None = None) -> None:
    """Read `stream` to its end, chunk by chunk, into `sink`."""
    while True:
        chunk = await stream.read(_READ_CHUNK)
        sink(chunk)
        if not chunk:
            return
        if log is not None and logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s: %s", log, chunk.decode(errors="replace").rstrip())


async def exit_code(process: asyncio.subprocess.Process) -> int:
    """The program's exit code once it has exited. Not `process.wait()`: that also waits for its
    pipes to close, which a child it left running may hold open."""
    delay = 0.005
    while process.returncode is None:
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.05)
    return process.returncode


def limits(cpu_s: float | None, memory_mb: int | None) -> Callable[[], None] | None:
    """A preexec function setting RLIMIT_CPU (seconds) and RLIMIT_AS (MiB) in the child; None: no limits."""
    if cpu_s is None and memory_mb is None:
        return None

    def apply() -> None:
        if cpu_s is not None:
            seconds = max(1, math.ceil(cpu_s))
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))  # SIGXCPU, then SIGKILL
        if memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))

    return apply


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (the program and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
