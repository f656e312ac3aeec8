"""The sandbox protocol: a fresh working copy per attempt and a way to run commands in it.

`open_sandbox` (alight.sandbox.factory) picks the backend named by `agent.sandbox.kind`; a new
backend is a new module with a `Sandbox` subclass. Every backend runs a command with its working
directory = the working copy, the environment it is given and nothing else, and kills all the
command started when it ends, times out or is cancelled.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from alight.errors import AlightError

#: How much of the end of a command's stdout and stderr a RunResult keeps.
TAIL_BYTES = 8192


class SandboxError(AlightError, code="sandbox_error"):
    """A sandbox could not be set up (a missing program, a kernel without namespaces)."""


class SandboxSettings(Protocol):
    """What a backend reads of `agent.sandbox` (alight.config.schema.SandboxConfig)."""

    kind: str
    workdir: str | None
    time_s: float | None
    cpu_s: float | None
    memory_mb: int | None
    expose: list[str]
    image: str | None


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


class Sandbox(ABC):
    """One attempt's sandbox. `workdir` is the host path of the working copy (read-write inside);
    `private` a host directory outside it, also visible and writable inside at the same path (the
    task and reward files of the attempt). Both are removed when the sandbox closes."""

    workdir: Path
    private: Path

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin: bytes = b"",
        timeout_s: float | None = None,
        stdout: Sink | None = None,
    ) -> RunResult:
        """Run `argv` in the working copy with exactly `env`; kill it (and all it started) after
        `timeout_s` or when cancelled. OSError-like start failures raise SandboxError."""

    async def close(self) -> None:  # noqa: B027 - backends without resources of their own keep this
        """Release what the sandbox holds beyond its folders (relays, containers)."""


def copy_working_copy(source: Path | None, target: Path) -> None:
    """Fill `target` (an empty folder) with a copy of `source` (symlinks kept as links), or leave it empty."""
    if source is None:
        return
    if not source.is_dir():
        raise SandboxError(f"agent.sandbox.workdir: {source} is not a directory")
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
