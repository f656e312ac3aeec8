"""The sandbox protocol: a fresh working copy per attempt and a way to run commands in it.

`open_sandbox` (alight.sandbox.factory) picks the backend named by `agent.sandbox.kind` from
`SANDBOXES`; a new backend is a new module with a `Sandbox` subclass plus one `register` call.
Every backend runs a command with its working directory = the working copy, the environment it is
given and nothing else, and kills all the command started when it ends, times out or is cancelled.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from alight.sandbox.result import RunResult, SandboxError, Sink

__all__ = ["Launch", "RunResult", "Sandbox", "SandboxError", "SandboxSettings", "Sink", "task_folder"]

#: A command's program named exactly so is the interpreter running alight (`with_alight_python`).
PYTHON_NAMES = ("python", "python3")


class SandboxSettings(Protocol):
    """What a backend reads of `agent.sandbox` (alight.config.schema.SandboxConfig)."""

    kind: str
    workdir: str | None
    time_s: float | None
    cpu_s: float | None
    memory_mb: int | None
    expose: list[str]
    image: str | None


class Sandbox(ABC):
    """One attempt's sandbox. `workdir` is the host path of the working copy (read-write inside);
    `private` a host directory outside it, also visible and writable inside at the same path (the
    task and reward files of the attempt). Both are removed when the sandbox closes.

    Each kind is registered by name in `alight.sandbox.factory.SANDBOXES` (`agent.sandbox.kind`) and
    states what others ask about it: `isolates`, `check_config` and `from_config`."""

    #: Whether a command is cut off from the host (its files, its network but the allowed URLs):
    #: a command agent then runs in this sandbox even without a working copy to fill.
    isolates: ClassVar[bool] = False
    #: Whether a command can run the interpreter running alight at its host path, so that `python`
    #: as its program means that one (`with_alight_python`); docker runs the image's own.
    runs_alight_python: ClassVar[bool] = True

    workdir: Path
    private: Path

    @classmethod
    def check_config(cls, settings: SandboxSettings) -> None:
        """ConfigError, in one line, where this kind cannot run with `settings` on this machine (the
        checks every kind shares are `check_sandbox`'s). Default: nothing more to check."""
        return None

    @classmethod
    @abstractmethod
    def from_config(cls, settings: SandboxSettings, folder: Path, allow: list[str]) -> Sandbox:
        """The sandbox of one attempt in `folder` (its `work` and `private` folders exist), whose
        commands may reach only the URLs in `allow` (where this kind isolates)."""

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
        `timeout_s` or when cancelled. A sandbox or program that cannot start: SandboxError."""
        from alight.sandbox.process import run_process

        launch = await self.launch(argv, env)
        try:
            run = functools.partial(run_process, stdin=stdin, timeout_s=timeout_s, stdout=stdout)
            result = await run(launch.argv, cwd=launch.cwd, env=launch.env, preexec=launch.preexec)
        finally:
            await self.ended(launch)
        return self.result(result)

    @abstractmethod
    async def launch(self, argv: Sequence[str], env: Mapping[str, str]) -> Launch:
        """The host process that runs `argv` with `env` in this sandbox."""

    async def ended(self, launch: Launch) -> None:  # noqa: B027 - most backends have nothing to end
        """Called when the launched process has ended or was killed (a container to remove)."""

    def result(self, result: RunResult) -> RunResult:
        """The command's result from the launched process's (a wrapper may report the command's own code)."""
        return result

    def shows(self, path: Path, argv: Sequence[str]) -> str | None:
        """The host folder shown inside (to a run of `argv`) through which `path` is readable, or
        None where it is not. A backend without isolation (`none`) answers None: it hides nothing."""
        return None

    async def close(self) -> None:  # noqa: B027 - backends without resources of their own keep this
        """Release what the sandbox holds beyond its folders (relays, containers)."""


@dataclass(frozen=True)
class Launch:
    """The host process a backend starts for one command: the command itself or its wrapper."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    preexec: Callable[[], None] | None = None
    name: str = ""  # what `ended` needs to find it again (a container's name)


def _runs_alight_python(sandbox: type[Sandbox] | Sandbox | None) -> bool:
    """Whether a command runs where the interpreter running alight is: on the host, or in a
    sandbox that shows it."""
    return bool(sys.executable) and (sandbox is None or sandbox.runs_alight_python)


def with_alight_python(argv: Sequence[str], sandbox: type[Sandbox] | Sandbox | None) -> list[str]:
    """`argv` with its program `python` or `python3` (exactly) replaced by the interpreter running
    alight, when it runs on the host (`sandbox` None) or in a sandbox that `runs_alight_python`: a
    command then needs no activated venv and no python on PATH. `sys.executable` is kept as it is,
    not resolved through its links: a venv's interpreter resolved is the base one, without the venv's
    packages. Any other program (`python3.11`, a path) is left as the config names it."""
    if argv and argv[0] in PYTHON_NAMES and _runs_alight_python(sandbox):
        return [sys.executable, *argv[1:]]
    return list(argv)


def with_alight_python_path(env: dict[str, str], sandbox: type[Sandbox] | Sandbox | None) -> dict[str, str]:
    """`env` with the folder of the interpreter running alight first on its PATH, as activating its
    venv does, where that interpreter runs (as in `with_alight_python`): a `python` the command
    itself calls (an agent's `python -c ...`) is then that interpreter too."""
    folder = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    if not _runs_alight_python(sandbox) or path.split(os.pathsep)[0] == folder:
        return env
    return {**env, "PATH": f"{folder}{os.pathsep}{path}"}


def task_folder(task: Any, field: str | None, base: Path, setting: str) -> Path | None:
    """The folder the task's `field` names (relative to `base`), or None without a field;
    SandboxError naming `setting` when the task has no such field or folder."""
    if field is None:
        return None
    value = task.get(field) if isinstance(task, dict) else getattr(task, field, None)
    if not isinstance(value, str) or not value:
        raise SandboxError(f"{setting}: the task has no field {field!r} naming a directory")
    folder = (base / value).expanduser()
    if not folder.is_dir():
        raise SandboxError(f"{setting}: {folder} is not a directory")
    return folder


def copy_working_copy(source: Path | None, target: Path) -> None:
    """Fill `target` (an empty folder) with a copy of `source` (symlinks kept as links), or leave it empty."""
    if source is None:
        return
    if not source.is_dir():
        raise SandboxError(f"agent.sandbox.workdir: {source} is not a directory")
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
