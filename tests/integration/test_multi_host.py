"""Two hosts on one machine: runners on one, store and proxy on the other, joined only by a network.

The "runner host" is a network namespace (`ip netns`) joined to this test's own namespace (the
"server host") by a veth pair, with no other route: its loopback is its own, so it reaches the
store and the proxy only at the addresses the run advertises, and the LLM (a scripted
OpenAI-compatible server on the server host's loopback, through the real LiteLLM engine) only
through the proxy. The run is the real `LocalStack` with no local runner (`runner.n_runners=0`);
`alight runner` runs in the other namespace with the run's token. Making namespaces needs root
and `ip` (iproute2): elsewhere the tests skip, saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alight.store.client import StoreClient
from alight.types import Rollout, RolloutStatus, SpanKind, Task
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.sample_agents import calculator_script

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-two-hosts-8d41e2"
AGENT = "tests.fixtures.sample_agents:calculator"


@dataclass
class Hosts:
    namespace: str  # the runner host
    server_ip: str  # this (the server) host's end of the link
    runner_ip: str

    def run(self, *command: str, **options: Any) -> subprocess.CompletedProcess[str]:
        """Run a command on the runner host."""
        return subprocess.run(["ip", "netns", "exec", self.namespace, *command], text=True, **options)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _why_no_namespaces() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    return None


@pytest.fixture
def two_hosts() -> Iterator[Hosts]:
    """A fresh namespace and veth pair (unique names), removed afterwards whatever happened."""
    reason = _why_no_namespaces()
    if reason is not None:
        pytest.skip(f"no multi-host test: {reason}")
    tag = uuid.uuid4().hex[:6]
    namespace, server_end, runner_end = f"alight-{tag}", f"als{tag}", f"alr{tag}"
    subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
    hosts = Hosts(namespace, f"{subnet}.1", f"{subnet}.2")
    try:
        made = _ip("netns", "add", namespace)
        if made.returncode != 0:
            pytest.skip(f"no multi-host test: cannot make a network namespace ({made.stderr.strip()})")
        steps = [
            ("link", "add", server_end, "type", "veth", "peer", "name", runner_end),
            ("link", "set", runner_end, "netns", namespace),
            ("addr", "add", f"{hosts.server_ip}/30", "dev", server_end),
            ("link", "set", server_end, "up"),
            ("-n", namespace, "addr", "add", f"{hosts.runner_ip}/30", "dev", runner_end),
            ("-n", namespace, "link", "set", runner_end, "up"),
            ("-n", namespace, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"no multi-host test: `ip {' '.join(step)}` failed ({done.stderr.strip()})")
        yield hosts
    finally:
        _ip("link", "del", server_end)  # takes its peer along
        _ip("netns", "del", namespace)


def _reachable(hosts: Hosts, targets: list[tuple[str, int]]) -> list[bool]:
    """Which (host, port) the runner host can open a TCP connection to."""
    probe = (
        "import json, socket, sys\n"
        "def ok(h, p):\n"
        "    try:\n"
        "        socket.create_connection((h, p), timeout=2).close()\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
        "print(json.dumps([ok(h, p) for h, p in json.loads(sys.argv[1])]))\n"
    )
    done = hosts.run(sys.executable, "-c", probe, json.dumps(targets), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [bool(x) for x in json.loads(done.stdout)]


def _config(tmp_path: Path, upstream: str, *overrides: str) -> Any:
    from alight.config import load_config, to_object
    from tests.cli.test_dev_and_trace import write_config

    engine = ["engine.kind=litellm", "engine.model=openai/scripted", f"engine.base_url={upstream}"]
    return to_object(load_config(write_config(tmp_path), [*engine, "runner.n_runners=0", *overrides]))


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def _roll(store_url: str, n: int, timeout_s: float) -> list[tuple[Rollout, list[Any], list[Any]]]:
    """Enqueue `n` rollouts, wait for them; each with its attempts and spans."""
    async with StoreClient(store_url) as store:
        rollouts = [Rollout(task=Task(input={"question": f"What is {i} + 2?"}), timeout_s=60.0) for i in range(n)]
        ids = [r.rollout_id for r in await store.enqueue(rollouts)]
        await store.wait_for_rollouts(ids, timeout=timeout_s)
        return [(await store.get_rollout(i), await store.list_attempts(i), await store.query_spans(i)) for i in ids]


def test_runners_on_another_host_reach_store_and_proxy_only_through_the_advertised_urls(
    two_hosts: Hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store binds the link's address (advertised as it is); the proxy binds every address
    (0.0.0.0) and advertises the link's address explicitly. With ALIGHT_TOKEN, as beyond loopback
    it must be."""
    from alight.trainer.stack import LocalStack

    hosts = two_hosts
    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)
    proxy_port = _free_port(hosts.server_ip)
    with ScriptedOpenAIServer(calculator_script) as upstream:
        cfg = _config(
            tmp_path,
            upstream.url,
            f"store.host={hosts.server_ip}",
            "proxy.host=0.0.0.0",
            f"proxy.port={proxy_port}",
            f"proxy.advertise_url=http://{hosts.server_ip}:{proxy_port}",
        )
        with LocalStack(cfg, tmp_path / "run") as stack:
            assert stack.pool is None  # every agent below runs on the runner host
            store_port = int(str(stack.store_advertise_url).rsplit(":", 1)[1])
            assert stack.store_advertise_url == f"http://{hosts.server_ip}:{store_port}"
            assert stack.resources()["llm"].endpoint == f"http://{hosts.server_ip}:{proxy_port}"

            # From the runner host: the advertised addresses answer; loopback reaches nothing of the
            # server host, and the LLM itself is out of reach (only the proxy gets to it).
            upstream_port = int(upstream.url.rsplit(":", 1)[1].split("/")[0])
            targets = [(hosts.server_ip, store_port), (hosts.server_ip, proxy_port)]
            targets += [("127.0.0.1", store_port), ("127.0.0.1", proxy_port), ("127.0.0.1", upstream_port)]
            targets += [(hosts.server_ip, upstream_port)]
            assert _reachable(hosts, targets) == [True, True, False, False, False, False]

            env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "ALIGHT_TOKEN": TOKEN}
            command = [sys.executable, "-m", "alight", "runner", "--store", str(stack.store_advertise_url)]
            command += ["--agent", AGENT, "-n", "2", "--drain-timeout", "10"]
            runner = subprocess.Popen(
                ["ip", "netns", "exec", hosts.namespace, *command],
                env=env,
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                assert stack.store_url is not None
                results = asyncio.run(_roll(stack.store_url, 4, timeout_s=120.0))
            finally:
                runner.terminate()  # SIGTERM: the runner drains and exits
                try:
                    _, stderr = runner.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    runner.kill()
                    _, stderr = runner.communicate()

    assert runner.returncode == 0, stderr
    assert "attempts succeeded 4" in stderr and TOKEN not in stderr, stderr
    worker_ids = set()
    for rollout, attempts, spans in results:
        assert (rollout.status, rollout.reward) == (RolloutStatus.SUCCEEDED, 1.0), attempts
        (attempt,) = attempts
        worker_ids.add(str(attempt.worker_id).split("-w")[0])
        llm_spans = [s for s in spans if s.kind == SpanKind.LLM]
        assert len(llm_spans) == 2  # the tool call and the answer, recorded by the proxy
        assert {(s.rollout_id, s.attempt_id) for s in spans} == {(rollout.rollout_id, attempt.attempt_id)}
    assert len(worker_ids) == 1  # one pool: the runner host's
    assert len(upstream.requests) == 8


def test_routable_address_on_a_host_with_a_default_route(two_hosts: Hosts) -> None:
    """The runner host gets a default route over the link: the address a wildcard bind there
    advertises is its end of the link (found without sending anything)."""
    hosts = two_hosts
    route = _ip("-n", hosts.namespace, "route", "add", "default", "via", hosts.server_ip)
    assert route.returncode == 0, route.stderr
    show = (
        "from alight.serving.advertise import advertised_url, routable_address\n"
        "print(routable_address(), advertised_url('0.0.0.0', 4747))\n"
    )
    done = hosts.run(
        sys.executable, "-c", show, capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [hosts.runner_ip, f"http://{hosts.runner_ip}:4747"]
