"""`agent.sandbox.kind: docker`: each command in a fresh `docker run` of `agent.sandbox.image`.

The working copy and the attempt's private folder are bind-mounted at their host paths, the
container has `--network none`, and each allowed URL's host:port is relayed into it as in the
local sandbox (namespace_init.py's relay, run by the image's `python3`: the image needs one where
`allow` is not empty). Limits are docker's flags: --memory, --ulimit cpu, --pids-limit; the wall
time kills the container (`docker kill`). Needs a docker daemon: the tests build the arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from alight.errors import ConfigError
from alight.sandbox.base import Launch, RunResult, SandboxSettings
from alight.sandbox.local import INIT, LocalSandbox

#: Processes a container may hold (a fork bomb stops here).
PIDS_LIMIT = 512
#: Where namespace_init.py and the relay sockets appear inside the container.
INSIDE = "/run/alight"
#: The docker client's own settings, passed to the client (not into the container).
CLIENT_VARIABLES = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "HOME")


class DockerSandbox(LocalSandbox):
    """The local sandbox's relays and spec, run by docker instead of unshare."""

    runs_alight_python = False  # the host's interpreter is not in the image: `python` is the image's

    @classmethod
    def check_config(cls, settings: SandboxSettings) -> None:
        if not settings.image:
            raise ConfigError("agent.sandbox.kind docker needs agent.sandbox.image")
        if shutil.which("docker") is None:
            raise ConfigError("agent.sandbox.kind docker: the docker client is not on PATH")

    def read_only(self, argv: Sequence[str]) -> list[str]:
        """The host folders a container sees: `expose` (the rest is the image's)."""
        return [str(Path(exposed).expanduser().absolute()) for exposed in self.settings.expose]

    def docker_args(self, argv: Sequence[str], env: Mapping[str, str], name: str) -> list[str]:
        """The exact `docker run` command line of one command, its container called `name`."""
        s = self.settings
        args = ["docker", "run", "--rm", "-i", "--name", name, "--network", "none", "--pids-limit", str(PIDS_LIMIT)]
        args += ["--read-only", "--tmpfs", "/tmp", "--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        if s.memory_mb is not None:
            args += ["--memory", f"{s.memory_mb}m", "--memory-swap", f"{s.memory_mb}m"]
        if s.cpu_s is not None:
            seconds = max(1, math.ceil(s.cpu_s))
            args += ["--ulimit", f"cpu={seconds}:{seconds + 1}"]
        for path, mode in ((self.workdir, "rw"), (self.private, "rw")):
            args += ["-v", f"{path}:{path}:{mode}"]
        for host in self.read_only(argv):
            args += ["-v", f"{host}:{host}:ro"]
        if self.relays:
            args += ["-v", f"{self.folder / 'relay'}:{INSIDE}/relay:ro", "-v", f"{INIT}:{INSIDE}/init.py:ro"]
        args += ["-w", str(self.workdir)]
        for name in sorted(env):
            args += ["-e", name]  # the value comes from docker's own environment: never on a command line
        args.append(s.image or "")
        if self.relays:
            relays = ",".join(f"{host}:{port}:{INSIDE}/relay/{i}.sock" for i, (host, port) in enumerate(self.relays))
            args += ["python3", f"{INSIDE}/init.py", "--relay", relays, "--"]
        return [*args, *argv]

    async def launch(self, argv: Sequence[str], env: Mapping[str, str]) -> Launch:
        await self._start_relays()
        name = f"alight-{uuid.uuid4().hex[:12]}"
        args = self.docker_args(argv, env, name)
        args[0] = shutil.which("docker") or "docker"
        client_env = {k: v for k, v in os.environ.items() if k in CLIENT_VARIABLES} | dict(env)
        return Launch(args, str(self.folder), client_env, name=name)

    async def ended(self, launch: Launch) -> None:
        await _kill(launch.argv[0], launch.name)

    def result(self, result: RunResult) -> RunResult:
        return result  # docker run exits with the command's own code


async def _kill(docker: str, name: str) -> None:
    """Killing the `docker run` client leaves the container running: kill it by name."""
    with contextlib.suppress(OSError):
        process = await asyncio.create_subprocess_exec(
            docker, "kill", name, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await process.wait()
