"""Write ids: a retried resource, reap or span write is applied once and answers as the first
did, in memory, in SQLite, over HTTP, and across a SIGKILL and restart of a real `alight store`
process."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from alight.errors import InvalidRequestError
from alight.store import MemoryStore, Store
from alight.store.client import StoreClient
from alight.store.sqlite import SqliteStore
from alight.store.sqlite_schema import SCHEMA_VERSION
from alight.store.wire import IDEMPOTENCY_HEADER
from alight.store.write_ids import WriteIdLimits
from alight.types import AttemptStatus, LLMResource, Resource, Rollout, RolloutStatus, Span, Task

pytestmark = pytest.mark.anyio

ALIGHT = [sys.executable, "-m", "alight"]


def _llm(model: str) -> dict[str, Resource]:
    return {"llm": LLMResource(endpoint="http://127.0.0.1:9/v1", model=model)}


async def test_a_repeated_resource_write_id_publishes_once(store: Store) -> None:
    first = await store.add_resources(_llm("a"), write_id="w-1")
    again = await store.add_resources(_llm("a"), write_id="w-1")
    other = await store.add_resources(_llm("b"), write_id="w-2")
    plain = await store.add_resources(_llm("c"))  # no write id: a new version every call
    assert again == first and first.version == 1
    assert (other.version, plain.version) == (2, 3)
    latest = await store.get_latest_resources()
    assert latest is not None and latest.version == 3


async def test_a_repeated_reap_write_id_reaps_once_and_returns_the_first_answer(store: Store) -> None:
    await store.enqueue([Rollout(rollout_id="r1", task=Task(input="x"), max_attempts=3)])
    claim = await store.dequeue("w")
    assert claim is not None
    reaped = await store.reap_timed_out(at=1e12, write_id="reap-1")
    assert [a.attempt_id for a in reaped] == [claim.attempt.attempt_id]
    again_claim = await store.dequeue("w")  # the rollout was requeued: a second attempt is live
    assert again_claim is not None
    assert await store.reap_timed_out(at=1e12, write_id="reap-1") == reaped  # the second attempt lives on
    assert [a.attempt_id for a in await store.reap_timed_out(at=1e12)] == [again_claim.attempt.attempt_id]


async def test_a_repeated_span_write_id_answers_the_first_count(store: Store) -> None:
    await store.enqueue([Rollout(rollout_id="r1", task=Task(input="x"))])
    claim = await store.dequeue("w")
    assert claim is not None
    spans = [Span(rollout_id="r1", attempt_id=claim.attempt.attempt_id, name=f"s{i}") for i in range(3)]
    assert await store.add_spans(spans[:2], write_id="spans-1") == 2
    assert await store.add_spans(spans[:2], write_id="spans-1") == 2  # the retry: the first answer
    assert await store.add_spans(spans[:2]) == 0  # without the id: nothing new
    assert await store.add_spans(spans, write_id="spans-2") == 1
    assert [s.name for s in await store.query_spans("r1")] == ["s0", "s1", "s2"]


async def test_a_write_id_used_by_another_kind_of_write_is_refused(store: Store) -> None:
    await store.add_resources(_llm("a"), write_id="shared")
    with pytest.raises(InvalidRequestError, match="already used by a resources write"):
        await store.reap_timed_out(write_id="shared")


def _local(kind: str, tmp_path: Path, limits: WriteIdLimits) -> Store:
    if kind == "memory":
        return MemoryStore(write_id_limits=limits)
    return SqliteStore(tmp_path / "s.db", write_id_limits=limits)


async def _pruned(store: Store, tmp_path: Path, limits: WriteIdLimits) -> Store:
    """The store after its record was pruned: SQLite prunes on open (and every 1024 writes), so
    it is reopened; the memory store prunes on every write."""
    if isinstance(store, MemoryStore):
        return store
    await store.close()
    return SqliteStore(tmp_path / "s.db", write_id_limits=limits)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_write_ids_are_bounded_by_count(kind: str, tmp_path: Path) -> None:
    limits = WriteIdLimits(max_ids=3)
    store = _local(kind, tmp_path, limits)
    for i in range(5):
        await store.add_resources(_llm(str(i)), write_id=f"w{i}")
    async with await _pruned(store, tmp_path, limits) as store:
        assert (await store.add_resources(_llm("x"), write_id="w4")).version == 5  # kept: recalled
        assert (await store.add_resources(_llm("x"), write_id="w0")).version == 6  # forgotten: applied


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_write_ids_are_bounded_by_age(kind: str, tmp_path: Path) -> None:
    limits = WriteIdLimits(retention_s=0.05)
    store = _local(kind, tmp_path, limits)
    await store.add_resources(_llm("a"), write_id="old")
    assert (await store.add_resources(_llm("a"), write_id="old")).version == 1  # still young
    time.sleep(0.1)
    async with await _pruned(store, tmp_path, limits) as store:
        assert (await store.add_resources(_llm("a"), write_id="old")).version == 2


async def test_sqlite_write_ids_survive_reopening_and_a_version_2_file_migrates(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with SqliteStore(db) as store:
        first = await store.add_resources(_llm("a"), write_id="w-1")
    with sqlite3.connect(db) as raw:  # the file as version 2 left it: no write_ids table
        raw.execute("DROP TABLE write_ids")
        raw.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    async with SqliteStore(db) as store:
        assert (await store.add_resources(_llm("b"), write_id="w-1")).version == 2  # the v2 file knew no ids
        assert (await store.add_resources(_llm("b"), write_id="w-1")).version == 2
    async with SqliteStore(db) as store:
        assert await store.add_resources(_llm("c"), write_id="w-1") == (await store.get_resources(2))
        assert (await store.get_resources(1)) == first
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


# -- a real `alight store` process, SIGKILLed between a write and its retry -----------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def store_process(tmp_path: Path) -> Iterator[tuple[Path, int, list[subprocess.Popen[bytes]]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield tmp_path / "store.db", _free_port(), processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def _start(db: Path, port: int, processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    command = [*ALIGHT, "store", "--db", str(db), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(process)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False, timeout=1.0).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, "alight store did not come up"
        time.sleep(0.05)


async def test_a_resource_write_retried_after_a_sigkill_restart_is_stored_once(
    store_process: tuple[Path, int, list[subprocess.Popen[bytes]]],
) -> None:
    db, port, processes = store_process
    url = f"http://127.0.0.1:{port}"
    body = {"resources": {"llm": _llm("policy-v1")["llm"].model_dump(mode="json")}}
    headers = {IDEMPOTENCY_HEADER: "rq-before-the-crash"}

    server = _start(db, port, processes)
    first = httpx.post(f"{url}/store/resources", json=body, headers=headers, trust_env=False)
    assert first.status_code == 200
    os.kill(server.pid, signal.SIGKILL)  # committed, then the process dies before anything else
    server.wait(timeout=10)

    _start(db, port, processes)
    retried = httpx.post(f"{url}/store/resources", json=body, headers=headers, trust_env=False)
    assert retried.status_code == 200 and retried.json() == first.json()
    async with StoreClient(url) as client:
        latest = await client.get_latest_resources()
        assert latest is not None and latest.version == first.json()["version"] == 1
        # The client's own write id travels the same way.
        published = await client.add_resources(_llm("policy-v2"), write_id="rq-client")
        assert (await client.add_resources(_llm("policy-v2"), write_id="rq-client")) == published
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT COUNT(*) FROM resources").fetchone()[0] == 2


async def test_queue_writes_retried_after_a_restart_are_applied_once_by_their_own_ids(tmp_path: Path) -> None:
    """Enqueue, dequeue and finish carry no write id: their own ids make a retry after a restart safe."""
    db = tmp_path / "store.db"
    rollout = Rollout(rollout_id="r1", task=Task(input="x"), max_attempts=3)
    async with SqliteStore(db) as store:
        await store.enqueue([rollout])
        claim = await store.dequeue("w", attempt_id="at-1")
        assert claim is not None
        await store.enqueue([Rollout(rollout_id="r2", task=Task(input="y"))])
        done = await store.dequeue("w", attempt_id="at-2")
        assert done is not None
        finished = await store.finish_attempt("at-2", AttemptStatus.SUCCEEDED, reward=1.0)
    async with SqliteStore(db) as store:  # the restart: at-1 was live, so it is timed out and r1 requeued
        assert (await store.enqueue([rollout]))[0].status is RolloutStatus.QUEUING
        again = await store.dequeue("w", attempt_id="at-1")  # the same claim back, not a second attempt
        assert again is not None and again.attempt.attempt_id == "at-1"
        assert again.attempt.status is AttemptStatus.TIMEOUT
        assert [a.attempt_id for a in await store.list_attempts("r1")] == ["at-1"]
        assert await store.finish_attempt("at-2", AttemptStatus.SUCCEEDED, reward=1.0) == finished
        assert len(await store.list_rollouts()) == 2


def _span_requests(port: int) -> tuple[dict[str, object], dict[str, object]]:
    """A claimed attempt in the store at `port`, and two span request bodies for it: one plain,
    one in groups (as the client's batcher sends them)."""
    url = f"http://127.0.0.1:{port}"
    rollout = Rollout(rollout_id="r1", task=Task(input="x")).model_dump(mode="json")
    assert httpx.post(f"{url}/store/enqueue", json={"rollouts": [rollout]}, trust_env=False).status_code == 200
    claim = httpx.post(f"{url}/store/dequeue", json={"worker_id": "w", "attempt_id": "at-1"}, trust_env=False)
    assert claim.status_code == 200
    spans = [Span(rollout_id="r1", attempt_id="at-1", name=f"s{i}").model_dump(mode="json") for i in range(5)]
    return {"spans": spans[:2]}, {"spans": spans[1:], "groups": [1, 3]}


async def test_a_span_write_retried_after_a_sigkill_restart_is_stored_once_and_answers_the_same(
    store_process: tuple[Path, int, list[subprocess.Popen[bytes]]],
) -> None:
    db, port, processes = store_process
    url = f"http://127.0.0.1:{port}"
    server = _start(db, port, processes)
    plain, grouped = _span_requests(port)
    first = httpx.post(f"{url}/store/spans", json=plain, headers={IDEMPOTENCY_HEADER: "rq-a"}, trust_env=False)
    first_groups = httpx.post(f"{url}/store/spans", json=grouped, headers={IDEMPOTENCY_HEADER: "rq-b"}, trust_env=False)
    assert first.json() == {"added": 2}
    assert first_groups.json() == {"added": 3, "groups": [{"added": 0}, {"added": 3}]}
    os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=10)

    _start(db, port, processes)
    retried = httpx.post(f"{url}/store/spans", json=plain, headers={IDEMPOTENCY_HEADER: "rq-a"}, trust_env=False)
    retried_groups = httpx.post(
        f"{url}/store/spans", json=grouped, headers={IDEMPOTENCY_HEADER: "rq-b"}, trust_env=False
    )
    assert (retried.status_code, retried.json()) == (200, first.json())
    assert (retried_groups.status_code, retried_groups.json()) == (200, first_groups.json())
    fresh = httpx.post(f"{url}/store/spans", json=plain, headers={IDEMPOTENCY_HEADER: "rq-c"}, trust_env=False)
    assert fresh.json() == {"added": 0}  # a new write of stored spans: nothing new
    async with StoreClient(url) as client:  # the client's own write id travels the same way
        extra = [Span(rollout_id="r1", attempt_id="at-1", name="s5")]
        assert await client.add_spans(extra, write_id="rq-client") == 1
        assert await client.add_spans(extra, write_id="rq-client") == 1
        assert [s.name for s in await client.query_spans("r1")] == [f"s{i}" for i in range(6)]
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT COUNT(*) FROM spans").fetchone()[0] == 6
