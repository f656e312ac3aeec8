"""PID 1 of a `kind: local` sandbox (run by `unshare` in fresh user, mount, pid and network
namespaces; standard library only, started by path; alight imports its `pipe` and `start_failure`).

    python namespace_init.py SPEC.json

It raises loopback, builds the allow-list root (tmpfs + read-only binds + the read-write working
copy + a private /tmp, /proc and /dev), pivots into it and detaches the host's tree, relays each
allowed host:port to the Unix socket the runner serves it on, then runs the command in a nested
user namespace (so it holds no capability over these mounts or this network) with the rlimits,
and exits when it does: the kernel then kills whatever the command left in the namespace. The
command's wait status is written to the spec's status file (opened before the pivot).
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import os
import resource
import shutil
import socket
import struct
import sys
from collections.abc import Mapping
from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
ST_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
PR_SET_DUMPABLE = 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(libc.mount(encode(src), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))  # SIOCSIFFLAGS: IFF_UP


def bind(src: str, target: str, rw: bool) -> None:
    """Bind `src` at `target` (created in the new root); read-only unless `rw`, keeping the source's
    nosuid/nodev/noexec (a user namespace may not clear them)."""
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    mount(src, target, None, MS_BIND | MS_REC)
    kept = sum(flag for st, flag in ST_FLAGS.items() if os.statvfs(src).f_flag & st and flag != MS_RDONLY)
    mount(None, target, None, MS_REMOUNT | MS_BIND | kept | MS_NOSUID | (0 if rw else MS_RDONLY))


def build_root(spec: dict[str, Any]) -> None:
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for tmp in ("tmp", "dev", "proc"):
        os.makedirs(f"{root}/{tmp}", exist_ok=True)
    mount("tmpfs", f"{root}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    mount("tmpfs", f"{root}/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            bind(f"/dev/{device}", f"{root}/dev/{device}", rw=True)
    os.makedirs(f"{root}/dev/shm")
    mount("tmpfs", f"{root}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{root}/dev/{name}")
    os.symlink("/proc/self/fd/2", f"{root}/dev/stderr")
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for entry in sorted(spec["mounts"], key=lambda m: m["dst"].count("/")):
        if entry.get("link"):
            os.symlink(entry["link"], root + entry["dst"])
        elif os.path.lexists(entry["src"]):
            bind(entry["src"], root + entry["dst"], entry["rw"])
    os.chdir(root)
    _check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount the host's tree")  # the old root, stacked on the new
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def relay(host: str, port: int, path: str) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, host, port)


def preexec(spec: dict[str, Any]) -> None:
    """In the command's process: rlimits, then a nested user namespace mapping root to root, which
    holds no capability over the mounts and network of the one this init set up."""
    if spec["cpu_s"] is not None:
        seconds = max(1, int(-(-spec["cpu_s"] // 1)))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    if spec["memory_mb"] is not None:
        resource.setrlimit(resource.RLIMIT_AS, (spec["memory_mb"] << 20,) * 2)
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(0x10000000), "unshare a user namespace")  # CLONE_NEWUSER
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def start_failure(program: str, env: Mapping[str, str], cwd: str, err: OSError) -> str:
    """Why `program` did not start, in one line: for a name not found, the PATH of `env` it was
    looked up on and which of its folders are absent here (inside a sandbox: the ones it hides)."""
    if "/" not in program and isinstance(err, FileNotFoundError):
        path = env.get("PATH", os.defpath)
        found = shutil.which(program, path=path)
        if found is None:
            absent = [folder for folder in path.split(os.pathsep) if folder and not os.path.isdir(folder)]
            note = f"; absent here: {', '.join(absent)}" if absent else ""
            return f"cannot start {program!r}: not found on PATH ({path or 'empty'}{note})"
        program = found
    if isinstance(err, FileNotFoundError) and os.path.isfile(os.path.join(cwd, program)):
        with open(os.path.join(cwd, program), "rb") as f:
            line = f.readline(256)
        if line.startswith(b"#!") and line[2:].split():
            interpreter = line[2:].split()[0].decode(errors="replace")
            return f"cannot start {program!r}: its #! interpreter {interpreter} is not found"
    return f"cannot start {program!r}: {err.strerror or err}"


def relay_spec(args: list[str]) -> dict[str, Any]:
    """The spec of `--relay HOST:PORT:SOCKET,... -- ARGV` (docker: relays only, no namespaces)."""
    relays: list[dict[str, Any]] = []
    for text in args[1].split(","):
        host, port, path = text.split(":", 2)
        relays.append({"host": host, "port": int(port), "socket": path})
    return {"relays": relays, "argv": args[3:], "cwd": os.getcwd(), "env": dict(os.environ), "nested": False}


async def main(spec: dict[str, Any]) -> int:
    servers = [await relay(r["host"], r["port"], r["socket"]) for r in spec["relays"]]
    try:
        process = await asyncio.create_subprocess_exec(
            *spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            preexec_fn=(lambda: preexec(spec)) if spec.get("nested", True) else None,
        )
    except OSError as err:
        print(f"alight sandbox: {start_failure(spec['argv'][0], spec['env'], spec['cwd'], err)}", file=sys.stderr)
        return 127
    await process.wait()
    for server in servers:
        server.close()
    return process.returncode if process.returncode is not None else 1


if __name__ == "__main__" and sys.argv[1:2] == ["--relay"]:
    sys.exit(asyncio.run(main(relay_spec(sys.argv[1:]))))
elif __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    status = open(spec["status"], "w")  # noqa: SIM115 - written after the pivot, when its path is gone
    try:
        loopback_up()
        build_root(spec)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the command may not ptrace this (still capable) init
        code = asyncio.run(main(spec))
    except Exception as err:  # one line on stderr, as the runner reports it
        print(f"alight sandbox: {err}", file=sys.stderr)
        code = 125
        status.write("setup")
    else:
        status.write(str(code))
    status.close()
    os._exit(0)
