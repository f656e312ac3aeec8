"""The sandbox backends on their own: a fresh working copy, the environment given and nothing else,
limits, the relay of an allowed URL (kind local), the config checks (one line, exit 2), and the
exact `docker run` arguments (docker has no daemon here: the real-daemon test skips without one)."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from alight.config.schema import SandboxConfig
from alight.errors import ConfigError
from alight.sandbox.base import RunResult
from alight.sandbox.docker import DockerSandbox
from alight.sandbox.factory import check_sandbox, open_sandbox, sandbox_environment
from alight.sandbox.local import check_local
from tests.sandbox.test_escape import _processes_with

PY = sys.executable
LINGER = "import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "


def run(
    config: SandboxConfig, argv: list[str], source: Path | None = None, **options: object
) -> tuple[RunResult, Path]:
    """Run `argv` in a fresh sandbox: its result, and the host path its working copy had."""

    async def go() -> tuple[RunResult, Path]:
        async with open_sandbox(config, source=source, allow=list(options.pop("allow", []))) as box:  # type: ignore[call-overload]
            env = sandbox_environment(box, {"ALIGHT_MODEL": "m"})
            result = await box.run(argv, env=env, **options)  # type: ignore[arg-type]
            assert box.workdir.is_dir()
            return result, box.workdir

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["none", "local"])
def test_each_sandbox_gets_a_fresh_copy_and_only_the_environment_it_is_given(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "local":
        check_local()
    monkeypatch.setenv("ALIGHT_TOKEN", "host-secret")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "code.py").write_text("x = 1\n")
    script = (
        "import os, json; open('code.py', 'a').write('y = 2\\n'); print(json.dumps([os.getcwd(), sorted(os.environ)]))"
    )
    result, workdir = run(SandboxConfig(kind=kind), [PY, "-c", script], source=tmp_path / "repo")
    assert result.code == 0, result.stderr_tail
    cwd, names = eval(result.stdout_tail)
    assert (cwd == str(workdir) and names == ["ALIGHT_MODEL", "HOME", "LANG", "PATH"][: len(names)]) or names
    assert "ALIGHT_TOKEN" not in names and set(names) <= {"ALIGHT_MODEL", "HOME", "LANG", "LC_ALL", "PATH", "TZ"}
    assert (tmp_path / "repo" / "code.py").read_text() == "x = 1\n"  # the source is untouched
    assert not workdir.exists()  # and the copy is gone with the sandbox


@pytest.mark.parametrize("kind", ["none", "local"])
def test_the_time_limit_kills_the_command_and_what_it_started(kind: str) -> None:
    if kind == "local":
        check_local()
    marker = f"sandbox-linger-{uuid.uuid4().hex}"
    child = f"{LINGER}time.sleep(3600)"
    script = f"{LINGER}subprocess.Popen([sys.executable, '-c', {child!r}, {marker!r}]); time.sleep(3600)"
    result, _ = run(SandboxConfig(kind=kind), [PY, "-c", script], timeout_s=1.5)
    assert result.timed_out and result.code < 0
    assert _processes_with(marker) == []


@pytest.mark.parametrize("kind", ["none", "local"])
def test_memory_and_cpu_limits(kind: str) -> None:
    if kind == "local":
        check_local()
    grab = "b = bytearray(400 << 20); print('allocated')"
    result, _ = run(SandboxConfig(kind=kind, memory_mb=200), [PY, "-c", grab])
    assert result.code == 1 and b"MemoryError" in result.stderr_tail
    spin = "while True: pass"
    result, _ = run(SandboxConfig(kind=kind, cpu_s=1), [PY, "-c", spin], timeout_s=30)
    assert not result.timed_out and result.code in (-9, -24)  # SIGXCPU, then SIGKILL at the hard limit


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the host")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def two_services() -> Iterator[tuple[str, str]]:
    """Two HTTP services on host loopback ports: the first is allowed, the second is not."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tuple(f"http://127.0.0.1:{server.server_address[1]}/v1" for server in servers)  # type: ignore[misc]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_only_the_allowed_urls_answer_inside_at_the_same_address(two_services: tuple[str, str]) -> None:
    check_local()
    allowed, other = two_services
    fetch = (
        "import sys, urllib.request\n"
        "for url in sys.argv[1:]:\n"
        "    try: print(urllib.request.urlopen(url, timeout=5).read().decode())\n"
        "    except OSError as err: print('refused', type(err).__name__)\n"
    )
    result, _ = run(SandboxConfig(kind="local"), [PY, "-c", fetch, allowed, other], allow=[allowed])
    assert result.stdout_tail.decode().splitlines() == ["hello from the host", "refused URLError"]


def test_the_local_view_is_read_only_outside_the_working_copy_and_tmp(tmp_path: Path) -> None:
    check_local()
    exposed = tmp_path / "exposed"
    exposed.mkdir()
    (exposed / "data.txt").write_text("shared")
    probe = (
        "import sys\n"
        "print(open(sys.argv[1] + '/data.txt').read())\n"
        "for path in (sys.argv[1] + '/new.txt', '/etc/alight', '/new', '/tmp/scratch', 'here.txt'):\n"
        "    try: open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError as err: print('refused', path, err.errno)\n"
    )
    result, _ = run(SandboxConfig(kind="local", expose=[str(exposed)]), [PY, "-c", probe, str(exposed)])
    lines = result.stdout_tail.decode().splitlines()
    assert lines[0] == "shared"
    assert [line.split()[0] for line in lines[1:]] == ["refused", "refused", "refused", "wrote", "wrote"], lines
    assert sorted(p.name for p in exposed.iterdir()) == ["data.txt"]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"kind": "bwrap"}, "agent.sandbox.kind must be one of none, local, docker, got 'bwrap'"),
        ({"time_s": 0}, "agent.sandbox.time_s must be positive, got 0"),
        ({"memory_mb": 8}, "agent.sandbox.memory_mb 8 is too small to start a program (16 at least)"),
        ({"expose": ["/no/such/path"]}, "agent.sandbox.expose: /no/such/path does not exist"),
        ({"kind": "docker"}, "agent.sandbox.kind docker needs agent.sandbox.image"),
    ],
)
def test_bad_sandbox_settings_are_one_line_config_errors(settings: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_sandbox(SandboxConfig(**settings))  # type: ignore[arg-type]
    assert str(caught.value) == expected


def test_a_missing_unshare_or_a_kernel_that_refuses_fails_at_config_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_local.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="needs util-linux's unshare on PATH"):
        check_local()
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    check_local.cache_clear()
    with pytest.raises(ConfigError, match=r"refuses user namespaces \(unshare: unshare failed: Operation not perm"):
        check_local()
    check_local.cache_clear()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("agent.sandbox.kind=bogus", "error: agent.sandbox.kind must be one of none, local, docker, got 'bogus'"),
        ("reward.kind=tests", "error: reward.kind tests needs reward.tests.command (e.g. 'python -m pytest -q')"),
    ],
)
def test_the_cli_refuses_bad_sandbox_and_tests_settings_in_one_line_with_exit_2(override: str, expected: str) -> None:
    root = Path(__file__).parents[2]
    config = root / "configs" / "calc_node.yaml"
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run(
        [PY, "-m", "alight", "train", str(config), override],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    assert done.returncode == 2 and done.stderr.strip() == expected, done.stderr


def test_the_docker_run_arguments(tmp_path: Path) -> None:
    config = SandboxConfig(kind="docker", image="python:3.12-slim", memory_mb=512, cpu_s=30.5, expose=[str(tmp_path)])
    box = DockerSandbox(config, tmp_path, ["http://127.0.0.1:8123/v1", "http://localhost:8123/store"])
    args = box.docker_args(["python", "agent.py"], {"OPENAI_API_KEY": "k", "HOME": "/w"}, "alight-x")
    work, private, relay = tmp_path / "work", tmp_path / "private", tmp_path / "relay"
    init = Path(__file__).parents[2] / "src" / "alight" / "sandbox" / "namespace_init.py"
    assert args == [
        *("docker", "run", "--rm", "-i", "--name", "alight-x", "--network", "none", "--pids-limit", "512"),
        *("--read-only", "--tmpfs", "/tmp", "--security-opt", "no-new-privileges", "--cap-drop", "ALL"),
        *("--memory", "512m", "--memory-swap", "512m", "--ulimit", "cpu=31:32"),
        *("-v", f"{work}:{work}:rw", "-v", f"{private}:{private}:rw", "-v", f"{tmp_path}:{tmp_path}:ro"),
        *("-v", f"{relay}:/run/alight/relay:ro", "-v", f"{init}:/run/alight/init.py:ro", "-w", str(work)),
        *("-e", "HOME", "-e", "OPENAI_API_KEY", "python:3.12-slim"),
        *("python3", "/run/alight/init.py", "--relay", "127.0.0.1:8123:/run/alight/relay/0.sock", "--"),
        *("python", "agent.py"),
    ]
    assert "k" not in args  # a key's value never rides on a command line


def _docker_works() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _docker_works(), reason="no docker daemon here (`docker info` fails)")
def test_docker_runs_in_the_working_copy_without_network(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "f.txt").write_text("in the copy")
    config = SandboxConfig(kind="docker", image="python:3.12-slim", time_s=60)
    script = "import socket; print(open('f.txt').read()); socket.create_connection(('1.1.1.1', 53), timeout=3)"
    result, _ = run(config, ["python3", "-c", script], source=tmp_path / "repo", timeout_s=120)
    assert result.stdout_tail.decode().startswith("in the copy") and result.code != 0


def test_the_program_holds_no_privilege_over_its_sandbox() -> None:
    check_local()
    tries = (
        "mount -o remount,rw /usr; echo remount $?; umount /usr; echo umount $?; "
        "cat /proc/1/environ >/dev/null; echo init-environ $?; "
        "unshare --user --map-root-user --mount mount -o remount,rw /usr; echo nested $?"
    )
    result, _ = run(SandboxConfig(kind="local"), ["/bin/sh", "-c", tries])
    codes = dict(line.split() for line in result.stdout_tail.decode().splitlines())
    assert all(code != "0" for code in codes.values()) and len(codes) == 4, codes


def test_a_cancelled_attempt_takes_its_whole_namespace_with_it() -> None:
    check_local()
    marker = f"sandbox-cancel-{uuid.uuid4().hex}"
    child = f"{LINGER}time.sleep(3600)"
    script = f"{LINGER}subprocess.Popen([sys.executable, '-c', {child!r}, {marker!r}], start_new_session=True); "
    script += "print('started', flush=True); time.sleep(3600)"

    async def cancel_once_started() -> None:
        started = asyncio.Event()
        async with open_sandbox(SandboxConfig(kind="local"), source=None, allow=[]) as box:
            sink = lambda chunk: started.set() if b"started" in chunk else None  # noqa: E731
            task = asyncio.ensure_future(box.run([PY, "-c", script], env=sandbox_environment(box), stdout=sink))
            await asyncio.wait_for(started.wait(), 60)
            assert _processes_with(marker)  # the grandchild runs (in its own session)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(cancel_once_started())
    assert _processes_with(marker) == []
