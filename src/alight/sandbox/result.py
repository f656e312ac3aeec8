"""What running a command in a sandbox gives back, and the error of a sandbox that cannot start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alight.errors import AlightError

#: How much of the end of a command's stdout and stderr a RunResult keeps.
TAIL_BYTES = 8192


class SandboxError(AlightError, code="sandbox_error"):
    """A sandbox could not be set up (a missing program, a kernel without namespaces)."""


@dataclass(frozen=True)
class RunResult:
    """How a command ended: its exit code (-N: killed by signal N), the ends of its output, and
    whether it ran past its time limit (then it and everything it started were killed)."""

    code: int
    stdout_tail: bytes = b""
    stderr_tail: bytes = b""
    timed_out: bool = False


#: Called with each chunk of a command's stdout as it arrives (b"" at its end).
Sink = Callable[[bytes], None]
