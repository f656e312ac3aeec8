"""`agent.sandbox.kind: none`: a fresh working copy in a temp folder, a plain process, no isolation.

The command runs with the environment it is given (nothing of the runner's), cwd = the working
copy, the CPU and memory limits as rlimits, and its process group killed at the end. It can still
read and write whatever the runner's user can, and reach the network: use `local` for that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from alight.sandbox.base import Launch, Sandbox, SandboxSettings
from alight.sandbox.process import limits


class PlainSandbox(Sandbox):
    @classmethod
    def from_config(cls, settings: SandboxSettings, folder: Path, allow: list[str]) -> PlainSandbox:
        return cls(settings, folder)  # no isolation: every URL is reachable, `allow` or not

    def __init__(self, settings: SandboxSettings, folder: Path) -> None:
        self.settings = settings
        self.workdir = folder / "work"
        self.private = folder / "private"

    async def launch(self, argv: Sequence[str], env: Mapping[str, str]) -> Launch:
        return Launch(list(argv), str(self.workdir), dict(env), limits(self.settings.cpu_s, self.settings.memory_mb))
