"""The sandbox escape test, through the real stack: a store server with a token, the LLM proxy
(scripted engine: no model runs here), a runner pool, and a command agent in `agent.sandbox.kind:
local` that tries to get out (escape_agent.py). Every try is stopped, its own model call through
the proxy works and is recorded (its report rides in it), the attempt that outlives its time limit
is killed with everything it started, and the next attempt still runs in the same pool."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.command_agent import CommandAgent
from alight.config.schema import SandboxConfig
from alight.proxy import Proxy, ProxyServer
from alight.runner.pool import RunnerPool
from alight.sandbox.local import check_local
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.types import LLMResource, Rollout, RolloutStatus, SpanKind, Task
from tests.proxy.scripted import ScriptedEngine

TOKEN = "tok-sandbox-escape-51f0"
AGENT = Path(__file__).with_name("escape_agent.py")
#: What a sandboxed program may find in its environment: the attempt's own variables and no more.
ALLOWED_ENV = {
    *("PATH", "LANG", "LC_ALL", "TZ", "HOME", "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL"),
    *("ANTHROPIC_API_KEY", "ALIGHT_MODEL", "ALIGHT_ROLLOUT_ID", "ALIGHT_ATTEMPT_ID", "ALIGHT_AGENT_NAME"),
    *("ALIGHT_TRACE_ID", "ALIGHT_PARENT_SPAN_ID", "ALIGHT_STORE_URL", "ALIGHT_TASK_FILE", "ALIGHT_REWARD_FILE"),
}


class Listener:
    """A host service on another loopback port that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def root_file() -> Iterator[Path]:
    """A file of the trainer's user under its home (/root here), gone after the test."""
    path = Path.home() / f".alight-escape-probe-{uuid.uuid4().hex[:8]}"
    path.write_text("secret")
    yield path
    path.unlink(missing_ok=True)


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_an_agent_that_tries_to_escape_is_stopped_every_time_and_the_run_goes_on(
    tmp_path: Path, root_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_local()  # this machine (and CI's Debian) makes user namespaces: no skip
    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)  # the pool finds it here; the agent must never see it
    monkeypatch.setenv("HOST_SECRET_FOR_THE_TEST", "must-not-leak")
    run_dir, marker, listener = tmp_path / "run", f"linger-{uuid.uuid4().hex}", Listener()
    run_dir.mkdir()
    (run_dir / "checkpoint.txt").write_text("weights")
    store_file = tmp_path / "store.db"
    probe = {
        "kind": "probe",
        "host_port": listener.port,
        "store": str(store_file),
        "run_dir": str(run_dir),
        "root_file": str(root_file),
        "beside_store": str(tmp_path / "escaped.txt"),
        "allocate_mb": 512,
    }
    sandbox = SandboxConfig(kind="local", time_s=10.0, memory_mb=256, cpu_s=30)
    agent = CommandAgent([sys.executable, str(AGENT)], name="escaper", sandbox=sandbox)
    try:
        with StoreServer(SqliteStore(store_file), token=TOKEN, watchdog_interval_s=0.5) as store_server:
            proxy_store = StoreClient(store_server.url, token=TOKEN)
            engine = ScriptedEngine()
            proxy = ProxyServer(Proxy(engine, proxy_store), token=TOKEN, resolve=proxy_store.check_credential).start()
            try:
                with RunnerPool(agent, store_server.url, n_runners=1, instrument=False, heartbeat_interval_s=0.5):
                    tasks = [{"kind": "linger", "marker": marker}, probe]
                    ended = asyncio.run(_run(store_server.url, proxy.url, tasks))
            finally:
                proxy.stop()
    finally:
        listener.close()
    (linger, error, _), (probed, _, spans) = ended
    assert linger.status == RolloutStatus.FAILED and "time_s=10.0" in (error or ""), (linger, error)
    assert _processes_with(marker) == []  # the grandchild that ignored SIGTERM died with the namespace
    assert probed.status == RolloutStatus.SUCCEEDED and probed.reward == 1.0, probed  # the run went on
    [call] = [span for span in spans if span.kind is SpanKind.LLM]  # its own model call, recorded
    report = json.loads(call.attributes[semconv.LLM_REQUEST_MESSAGES][0]["content"])
    tried = report["tried"]
    assert tried.pop("write working copy") == "done"
    assert tried.pop("write next to store") in ("done", "refused: OSError")  # the private /tmp at most
    assert all(result.startswith("refused") for result in tried.values()), tried
    assert tried["memory"] == "refused: MemoryError"
    assert listener.accepted == 0  # the host's other loopback service never saw it
    assert not (tmp_path / "escaped.txt").exists() and not Path("/usr/alight-escape").exists()
    assert set(report["env"]) <= ALLOWED_ENV, set(report["env"]) - ALLOWED_ENV
    assert {"OPENAI_API_KEY", "ALIGHT_MODEL"} <= set(report["env"])


async def _run(store_url: str, proxy_url: str, tasks: list[dict[str, Any]]) -> list[tuple[Any, str | None, list[Any]]]:
    """Run `tasks` one after another (one runner): each rollout when it ended, with its spans."""
    async with StoreClient(store_url, token=TOKEN) as admin:
        await admin.add_resources({"llm": LLMResource(endpoint=proxy_url, model="scripted")})
        queued = await admin.enqueue([Rollout(task=Task(input=task), timeout_s=60.0) for task in tasks])
        ended = []
        for rollout in queued:
            deadline = time.monotonic() + 90
            while (now := await admin.get_rollout(rollout.rollout_id)).status in (
                RolloutStatus.QUEUING,
                RolloutStatus.RUNNING,
            ):
                assert time.monotonic() < deadline, f"rollout {rollout.rollout_id} did not end"
                await asyncio.sleep(0.2)
            [attempt] = await admin.list_attempts(rollout.rollout_id)
            ended.append((now, attempt.error, await admin.query_spans(rollout.rollout_id)))
        return ended
