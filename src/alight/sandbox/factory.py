"""`open_sandbox`: the sandbox of one attempt, by `agent.sandbox.kind`; `check_sandbox` for config load.

    async with open_sandbox(cfg.agent.sandbox, source=Path("repo"), allow=[proxy_url]) as box:
        result = await box.run(["python", "agent.py"], env=sandbox_environment(box), timeout_s=60)

A new backend is a new module whose Sandbox subclass states `isolates`, `check_config` and
`from_config`, plus one line: `SANDBOXES.register("name", "module:Class")`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from alight.errors import ConfigError
from alight.parts import Registry
from alight.sandbox.base import Sandbox, SandboxSettings, copy_working_copy, with_alight_python_path

#: The sandbox kinds (`agent.sandbox.kind`), the default first.
SANDBOXES: Registry[Sandbox] = Registry(
    "agent.sandbox.kind",
    {
        "none": "alight.sandbox.plain:PlainSandbox",
        "local": "alight.sandbox.local:LocalSandbox",
        "docker": "alight.sandbox.docker:DockerSandbox",
    },
)
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
        box = sandbox_class(config.kind).from_config(config, folder, allow)
        try:
            yield box
        finally:
            await box.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sandbox_class(kind: str) -> type[Sandbox]:
    """The class of the sandbox kind `kind`; ConfigError naming the kinds for an unknown one."""
    return SANDBOXES.get(kind)


def isolates(kind: str) -> bool:
    """Whether the sandbox kind `kind` cuts its commands off from the host (`Sandbox.isolates`)."""
    return sandbox_class(kind).isolates


def sandbox_environment(box: Sandbox, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """The cleared environment of a sandboxed command: PATH (the folder of the interpreter running
    alight first, where the sandbox runs it), LANG (and LC_ALL, TZ) of the runner, HOME = the
    working copy, and `extra` (the attempt's own variables). Nothing else of the host."""
    env = {name: os.environ[name] for name in KEPT_VARIABLES if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(box.workdir)
    env.update(extra)
    return with_alight_python_path(env, box)


def check_sandbox(config: SandboxSettings) -> None:
    """Raise a one-line ConfigError for settings no sandbox can honour on this machine: an unknown
    kind, the limits and `expose` every kind reads, then the kind's own `check_config`."""
    cls = sandbox_class(config.kind)
    for name in ("time_s", "cpu_s", "memory_mb"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ConfigError(f"agent.sandbox.{name} must be positive, got {value!r}")
    if config.memory_mb is not None and config.memory_mb < 16:
        raise ConfigError(f"agent.sandbox.memory_mb {config.memory_mb} is too small to start a program (16 at least)")
    for path in config.expose:
        if not Path(path).expanduser().exists():
            raise ConfigError(f"agent.sandbox.expose: {path} does not exist")
    cls.check_config(config)
