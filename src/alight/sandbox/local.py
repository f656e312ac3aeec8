"""`agent.sandbox.kind: local`: Linux namespaces through util-linux's `unshare` (no root needed).

Each command runs in fresh user, mount, pid and network namespaces (namespace_init.py is their
PID 1). The network has only loopback, where each allowed URL's host:port (the proxy, the store)
answers as outside: a relay inside forwards it to a Unix socket this runner serves and connects on
to the real address; nothing else is reachable. The filesystem is an allow-list: the system
folders, the Python prefixes, the command's own folders and `expose` read-only, the working copy and
the attempt's private folder read-write, a private /tmp; the rest of the host is absent. Limits:
wall time (the whole namespace is killed), RLIMIT_CPU and RLIMIT_AS per process.

`python` in a command is the interpreter running alight (alight.sandbox.base.with_alight_python):
its venv (`sys.prefix`), the base installation it links to (`sys.base_prefix`, and the folder of
its resolved executable, a program folder) are shown, so it runs inside with the venv's packages.
Folders only a `.pth` file names (the source of an editable install) are not: add them to `expose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from alight.errors import ConfigError
from alight.sandbox.base import Launch, RunResult, Sandbox, SandboxError, SandboxSettings
from alight.sandbox.namespace_init import pipe

INIT = Path(__file__).with_name("namespace_init.py")
UNSHARE = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child")
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


class LocalSandbox(Sandbox):
    isolates = True

    @classmethod
    def check_config(cls, settings: SandboxSettings) -> None:
        check_local()

    @classmethod
    def from_config(cls, settings: SandboxSettings, folder: Path, allow: list[str]) -> LocalSandbox:
        return cls(settings, folder, allow)

    def __init__(self, settings: SandboxSettings, folder: Path, allow: list[str]) -> None:
        self.settings = settings
        self.folder = folder
        self.workdir = folder / "work"
        self.private = folder / "private"
        self.relays = relay_targets(allow)
        self._servers: list[asyncio.Server] = []
        (folder / "root").mkdir(exist_ok=True)
        (folder / "relay").mkdir(exist_ok=True)

    async def launch(self, argv: Sequence[str], env: Mapping[str, str]) -> Launch:
        await self._start_relays()
        (self.folder / "status").write_text("")
        spec = self.folder / "spec.json"
        spec.write_text(json.dumps(self.spec(argv, env)))
        unshare = shutil.which("unshare") or "unshare"
        command = [unshare, *UNSHARE, sys.executable, "-I", str(INIT), str(spec)]
        return Launch(command, str(self.folder), {"PATH": os.defpath})

    def result(self, result: RunResult) -> RunResult:
        """The command's own exit status, which namespace_init.py wrote (its init exits 0)."""
        written = (self.folder / "status").read_text().strip()
        if written == "setup":
            line = result.stderr_tail.decode(errors="replace").strip().splitlines()[-1:] or ["no reason given"]
            raise SandboxError(f"the local sandbox could not start: {line[0]}")
        if written:
            return RunResult(int(written), result.stdout_tail, result.stderr_tail, result.timed_out)
        return result  # the namespace was killed (time limit, cancellation) before its init wrote a status

    def read_only(self, argv: Sequence[str]) -> list[str]:
        """The host folders a run of `argv` sees read-only: the system, the Python prefixes, the
        program's own folders and `expose`."""
        read_only = [*SYSTEM, sys.prefix, sys.base_prefix, sys.exec_prefix, *self.settings.expose]
        read_only += [str(Path(part).parent) for part in _program_files(argv)]
        return list(dict.fromkeys(str(Path(p).expanduser().absolute()) for p in read_only))

    def shows(self, path: Path, argv: Sequence[str]) -> str | None:
        target = path.resolve()
        for shown in self.read_only(argv):
            folder = Path(shown).resolve()
            if target == folder or folder in target.parents:
                return shown
        return None

    def spec(self, argv: Sequence[str], env: Mapping[str, str]) -> dict[str, object]:
        """What namespace_init.py builds and runs."""
        mounts: list[dict[str, object]] = []
        for path in self.read_only(argv):
            if path in SYSTEM and os.path.islink(path):
                mounts.append({"src": path, "dst": path, "link": os.readlink(path)})  # /bin -> usr/bin stays a link
            else:
                mounts.append({"src": path, "dst": path, "rw": False})
        for folder, rw in ((self.workdir, True), (self.private, True), (self.folder / "relay", False)):
            mounts.append({"src": str(folder), "dst": str(folder), "rw": rw})
        relays = [
            {"host": host, "port": port, "socket": str(self.folder / "relay" / f"{i}.sock")}
            for i, (host, port) in enumerate(self.relays)
        ]
        return {
            "root": str(self.folder / "root"),
            "status": str(self.folder / "status"),
            "mounts": mounts,
            "relays": relays,
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(self.workdir),
            "cpu_s": self.settings.cpu_s,
            "memory_mb": self.settings.memory_mb,
        }

    async def _start_relays(self) -> None:
        if self._servers or not self.relays:
            return
        for i, (host, port) in enumerate(self.relays):
            handler = functools.partial(_forward, host, port)
            self._servers.append(await asyncio.start_unix_server(handler, str(self.folder / "relay" / f"{i}.sock")))

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()


def relay_targets(allow: list[str]) -> list[tuple[str, int]]:
    """The distinct loopback (host, port) pairs of the allowed URLs; SandboxError for another host
    (a relay reproduces a loopback address inside the namespace, not a remote one)."""
    targets: list[tuple[str, int]] = []
    for url in allow:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        ip = "127.0.0.1" if host == "localhost" else host
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(ip).is_loopback and (ip, port) not in targets:
                targets.append((ip, port))
                continue
        if (ip, port) not in targets:
            raise SandboxError(f"agent.sandbox.kind local reaches loopback addresses only, not {url}")
    return targets


async def _forward(host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One relayed connection: from the namespace's socket to the real host:port."""
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def _program_files(argv: Sequence[str]) -> list[str]:
    """The absolute paths among the command's first arguments that name files (the program, its script)."""
    found = []
    for part in argv[:3]:
        if os.path.isabs(part) and os.path.isfile(part):
            found += [part, os.path.realpath(part)]
    return found


@functools.cache
def check_local() -> None:
    """ConfigError, in one line, where this machine cannot make the namespaces (once per process)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ConfigError("agent.sandbox.kind local needs util-linux's unshare on PATH (apt-get install util-linux)")
    if not hasattr(os, "uname") or os.uname().machine not in ("x86_64", "aarch64"):
        raise ConfigError("agent.sandbox.kind local runs on Linux x86_64 and aarch64 only")
    try:
        done = subprocess.run([unshare, *UNSHARE, "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"agent.sandbox.kind local: unshare does not run: {err}") from None
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise ConfigError(f"agent.sandbox.kind local: this kernel refuses user namespaces ({reason[0]})")
