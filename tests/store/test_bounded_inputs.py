"""Bad input at the store server's edge: each found by a probe (a 500 or a stored value that broke
later reads), each answered 4xx now, with the server still serving after.

A real `StoreServer` (uvicorn in a thread) over a real SqliteStore; requests go by httpx.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore

BIG = 2**64


@pytest.fixture
def server(tmp_path: Path) -> Iterator[StoreServer]:
    store = SqliteStore(tmp_path / "store.db")
    with StoreServer(store, watchdog_interval_s=None, max_body_bytes=2**20, max_wait_s=1.0) as served:
        yield served


@pytest.fixture
def http(server: StoreServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def claim(http: httpx.Client) -> tuple[str, str]:
    answer = http.post("/store/enqueue", json={"rollouts": [{"task": {"input": "q"}}]})
    assert answer.status_code == 200, answer.text
    got = http.post("/store/dequeue", json={}).json()
    return got["rollout"]["rollout_id"], got["attempt"]["attempt_id"]


def assert_refused(answer: httpx.Response, *statuses: int) -> None:
    assert answer.status_code in (statuses or (400, 422)), (answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["code"] and "\n" not in error["message"]


def assert_alive(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}


def otlp_json(rid: str, aid: str, **span: Any) -> dict[str, Any]:
    attrs = [
        {"key": "alight.rollout_id", "value": {"stringValue": rid}},
        {"key": "alight.attempt_id", "value": {"stringValue": aid}},
    ]
    body = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "attributes": attrs, "startTimeUnixNano": "1"}
    body.update(span)
    return {"resourceSpans": [{"scopeSpans": [{"spans": [body]}]}]}


def test_integers_past_sqlite_range_are_refused(http: httpx.Client) -> None:
    rid, aid = claim(http)
    span = {"rollout_id": rid, "attempt_id": aid, "name": "s", "sequence_id": BIG}
    assert_refused(http.post("/store/spans", json={"spans": [span]}))
    assert_refused(http.get("/store/rollouts", params={"limit": str(BIG)}))
    assert_refused(http.get("/store/rollouts", params={"offset": str(BIG)}))
    assert_refused(http.post("/store/rollouts/query", json={"limit": BIG}))
    assert_refused(http.get("/store/resources/99999999999999999999"))
    rollout = {"task": {"input": "q"}, "resources_version": BIG}
    assert_refused(http.post("/store/enqueue", json={"rollouts": [rollout]}))
    assert_alive(http)


def test_otlp_numbers_past_range_and_deep_nesting_are_refused(http: httpx.Client) -> None:
    rid, aid = claim(http)
    # a 23-digit sequence id: the span is refused (counted in the partial success), not a 500
    seq = {"key": "alight.sequence_id", "value": {"intValue": "1" * 23}}
    body = otlp_json(rid, aid)
    body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(seq)
    answer = http.post("/v1/traces", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert_refused(http.post("/v1/traces", json=otlp_json(rid, aid, startTimeUnixNano="9" * 400)), 400)
    deep = "[" * 100_000 + "]" * 100_000
    answer = http.post("/v1/traces", content=deep, headers={"content-type": "application/json"})
    assert_refused(answer, 400)
    assert_alive(http)


def test_non_finite_numbers_are_refused(http: httpx.Client) -> None:
    rid, aid = claim(http)
    for bad in ("NaN", "Infinity", "-Infinity"):
        span = f'{{"rollout_id": "{rid}", "attempt_id": "{aid}", "name": "s", "start_time": {bad}}}'
        assert_refused(http.post("/store/spans", content=f'{{"spans": [{span}]}}'))
        answer = http.post(f"/store/attempts/{aid}/finish", content=f'{{"status": "succeeded", "reward": {bad}}}')
        assert_refused(answer)
        assert_refused(http.post("/store/reap", content=f'{{"at": {bad}}}'))
    # nothing was stored: the rollout's spans still read, the attempt still finishes
    assert http.get(f"/store/rollouts/{rid}/spans").json() == []
    finished = http.post(f"/store/attempts/{aid}/finish", json={"status": "succeeded", "reward": 1.0})
    assert finished.json()["reward"] == 1.0


def test_a_nan_row_written_straight_into_sqlite_still_reads(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    with StoreServer(store, watchdog_interval_s=None) as server, httpx.Client(base_url=server.url) as http:
        rid, aid = claim(http)
        spans = [{"rollout_id": rid, "attempt_id": aid, "name": n, "start_time": 1.0} for n in ("a", "b")]
        assert http.post("/store/spans", json={"spans": spans}).status_code == 200
        db = sqlite3.connect(tmp_path / "store.db")
        with db:  # as a store before this fix kept a NaN start time: null in the JSON, NULL in the column
            db.execute("UPDATE spans SET start_time = NULL, data = json_set(data, '$.start_time', json('null'))")
        db.close()
        read = http.get(f"/store/rollouts/{rid}/spans")
        assert read.status_code == 200, read.text
        assert sorted(span["name"] for span in read.json()) == ["a", "b"]
        assert all(span["start_time"] == 0.0 for span in read.json())
        assert http.post("/store/bulk/spans", json={"rollout_ids": [rid]}).status_code == 200


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory of process `pid` (Linux VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture
def store_process(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A store server in its own process (1 MiB body limit), so its peak memory is its own: (url, pid)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "from alight.store.server import serve; from alight.store.sqlite import SqliteStore; "
        f"serve(SqliteStore({str(tmp_path / 's.db')!r}), port={port}, max_body_bytes=2**20)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the store server did not start"
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compression_bomb_is_refused_with_memory_bounded(store_process: tuple[str, int], encoding: str) -> None:
    url, pid = store_process
    http = httpx.Client(base_url=url, timeout=60)
    rid, aid = claim(http)
    # ~1 MB on the wire that would inflate to 1 GiB; the server's limit is 1 MiB
    inflated = 2**30
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    chunk = b"\0" * 2**24
    body = b"".join(packer.compress(chunk) for _ in range(inflated // len(chunk))) + packer.flush()
    assert len(body) < 2**20
    before = peak_rss_mib(pid)
    for _ in range(3):
        answer = http.post(
            "/v1/traces", content=body, headers={"content-type": "application/json", "content-encoding": encoding}
        )
        assert_refused(answer, 413)
    grown = peak_rss_mib(pid) - before
    assert grown < 200, f"the server's peak RSS grew by {grown:.0f} MiB (from {before:.0f} MiB)"
    # a compressed export under the limit is still read
    small = gzip.compress(json.dumps(otlp_json(rid, aid)).encode())
    answer = http.post(
        "/v1/traces", content=small, headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    assert answer.status_code == 200, answer.text
    assert len(http.get(f"/store/rollouts/{rid}/spans").json()) == 1
    assert_refused(http.post("/v1/traces", content=b"not gzip", headers={"content-encoding": "gzip"}), 400)
    http.close()


def test_wait_is_capped_and_freed_when_the_client_goes(server: StoreServer, http: httpx.Client) -> None:
    rid, _ = claim(http)
    for timeout in ("1e300", "1e308"):
        started = time.monotonic()
        answer = http.post("/store/wait", content=f'{{"rollout_ids": ["{rid}"], "timeout": {timeout}}}')
        assert answer.status_code == 200 and answer.json() == []
        assert time.monotonic() - started < 5  # the server's cap here is 1 s
    assert_refused(http.post("/store/wait", content=f'{{"rollout_ids": ["{rid}"], "timeout": Infinity}}'))


def test_a_waiting_client_that_hangs_up_frees_its_request(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    served = StoreServer(store, watchdog_interval_s=None, max_wait_s=60)
    with served as server, httpx.Client(base_url=server.url) as http:
        rid, _ = claim(http)
        waits_before = _waiters(server)
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps({"rollout_ids": [rid], "timeout": 50}).encode()
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                b"POST /store/wait HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            deadline = time.monotonic() + 5
            while _waiters(server) == waits_before and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _waiters(server) == waits_before + 1
        deadline = time.monotonic() + 5  # the socket is closed: the server stops waiting
        while _waiters(server) > waits_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiters(server) == waits_before
        assert_alive(http)


def _waiters(server: StoreServer) -> int:
    # Tasks on the server's loop still inside `wait_for_rollouts`.
    import asyncio

    async def count() -> int:
        return sum(1 for task in asyncio.all_tasks() if "wait_for_rollouts" in repr(task.get_coro()))

    return server.run(count(), timeout_s=5)


def test_read_row_reads_a_nan_literal_as_null() -> None:
    from alight.store.sqlite_schema import read_row
    from alight.types import Rollout, Span

    row = '{"rollout_id": "r", "attempt_id": "a", "name": "s", "start_time": NaN, "end_time": Infinity}'
    span = read_row(Span, row)
    assert (span.start_time, span.end_time) == (0.0, None)
    rollout = read_row(Rollout, '{"rollout_id": "r", "task": {"input": 1}, "reward": NaN}')
    assert rollout.reward is None
