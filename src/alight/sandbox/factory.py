"""`open_sandbox`: the sandbox of one attempt, by `agent.sandbox.kind`; `check_sandbox` for config load.

    async with open_sandbox(cfg.agent.sandbox, source=Path("repo"), allow=[proxy_url]) as box:
        result = await box.run(["python", "agent.py"], env=sandbox_environment(box), timeout_s=60)

A new backend is a new module whose Sandbox subclass `open_sandbox` builds for its kind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from alight.errors import ConfigError
from alight.sandbox.base import Sandbox, SandboxSettings, copy_working_copy

KINDS = ("none", "local", "docker")
#: The only host variables a sandboxed command gets (besides HOME and what the attempt adds).
KEPT_VARIABLES = ("PATH", "LANG", "LC_ALL", "TZ")


@contextlib.asynccontextmanager
async def open_sandbox(config: SandboxSettings, *, source: Path | None, allow: list[str]) -> AsyncIterator[Sandbox]:
    """A sandbox whose working copy is a fresh copy of `source` (empty for None) and whose commands
    may reach only the URLs in `allow` (kind local and docker; kind none does not isolate). Its
    folders, processes and relays are gone when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="alight-sandbox-"))
    try:
        (folder / "work").mkdir()
        (folder / "private").mkdir()
        copy_working_copy(source, folder / "work")
        box = _backend(config, folder, allow)
        try:
            yield box
        finally:
            await box.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _backend(config: SandboxSettings, folder: Path, allow: list[str]) -> Sandbox:
    if config.kind == "local":
        from alight.sandbox.local import LocalSandbox

        return LocalSandbox(config, folder, allow)
    if config.kind == "docker":
        from alight.sandbox.docker import DockerSandbox

        return DockerSandbox(config, folder, allow)
    from alight.sandbox.plain import PlainSandbox

    return PlainSandbox(config, folder)


def sandbox_environment(box: Sandbox, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """The cleared environment of a sandboxed command: PATH, LANG (and LC_ALL, TZ) of the runner,
    HOME = the working copy, and `extra` (the attempt's own variables). Nothing else of the host."""
    env = {name: os.environ[name] for name in KEPT_VARIABLES if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(box.workdir)
    env.update(extra)
    return env


def check_sandbox(config: SandboxSettings) -> None:
    """Raise a one-line ConfigError for settings no sandbox can honour on this machine."""
    if config.kind not in KINDS:
        raise ConfigError(f"agent.sandbox.kind must be one of {', '.join(KINDS)}, got {config.kind!r}")
    for name in ("time_s", "cpu_s", "memory_mb"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ConfigError(f"agent.sandbox.{name} must be positive, got {value!r}")
    if config.memory_mb is not None and config.memory_mb < 16:
        raise ConfigError(f"agent.sandbox.memory_mb {config.memory_mb} is too small to start a program (16 at least)")
    for path in config.expose:
        if not Path(path).expanduser().exists():
            raise ConfigError(f"agent.sandbox.expose: {path} does not exist")
    if config.kind == "local":
        from alight.sandbox.local import check_local

        check_local()
    if config.kind == "docker":
        if not config.image:
            raise ConfigError("agent.sandbox.kind docker needs agent.sandbox.image")
        if shutil.which("docker") is None:
            raise ConfigError("agent.sandbox.kind docker: the docker client is not on PATH")
