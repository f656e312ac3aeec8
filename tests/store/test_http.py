"""The HTTP store server and client on loopback: bad input, retries, batching, many processes.

Everything runs for real: uvicorn in a thread, the client, and where a network fault is needed,
a small TCP relay between them that drops one answer.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from alight.errors import ConfigError, NotFoundError, PayloadTooLargeError, StoreError, StoreUnavailableError
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer, serve
from alight.types import Attempt, AttemptStatus, Claim, Rollout, RolloutStatus, Span, Task

pytestmark = pytest.mark.anyio


def rollouts(n: int, **fields: Any) -> list[Rollout]:
    return [Rollout(task=Task(input={"question": f"q{i}"}), **fields) for i in range(n)]


def spans_for(claim: Claim, n: int, prefix: str = "call", **fields: Any) -> list[Span]:
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    return [Span(rollout_id=rid, attempt_id=aid, name=f"{prefix}-{i}", **fields) for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as running:
        yield running


@pytest.fixture
async def client(server: StoreServer) -> AsyncIterator[StoreClient]:
    async with StoreClient(server.url) as store:
        yield store


class Relay:
    """A TCP relay on loopback in front of the server. It counts the requests it forwards, and
    when `drop` is set, forwards the first request starting with it but cuts the client's
    connection instead of relaying the answer."""

    def __init__(self, target: StoreServer, drop: bytes | None = None) -> None:
        self.target_port = target.port
        self.drop = drop
        self.dropped = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def count(self, request_line: bytes) -> int:
        return sum(line.startswith(request_line) for line in self.requests)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        answer_dropped = asyncio.Event()

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                if data.startswith((b"GET ", b"POST ")):
                    self.requests.append(data.split(b"\r\n", 1)[0])
                    if self.drop is not None and not self.dropped and data.startswith(self.drop):
                        self.dropped += 1
                        answer_dropped.set()
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(1 << 16):
                if answer_dropped.is_set():  # the server answered the doomed request: cut the client off
                    writer.transport.abort()
                    up_writer.close()
                    return
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


# -- bad input --------------------------------------------------------------------------------


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    assert message and "\n" not in message
    return message


async def test_bad_requests_get_one_line_errors_and_change_nothing() -> None:
    with StoreServer(MemoryStore(), max_body_bytes=4096, watchdog_interval_s=None) as server:
        async with StoreClient(server.url) as store:
            [queued] = await store.enqueue(rollouts(1))
            claim = await store.dequeue("w")
            assert claim is not None
            await store.add_spans(spans_for(claim, 3))
            aid = claim.attempt.attempt_id
            before = (await store.get_rollout(queued.rollout_id), await store.query_spans(queued.rollout_id))

            async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
                message = assert_error(
                    await http.post("/store/enqueue", content=b'{"rollouts": [{'), 422, "invalid_request"
                )
                assert "JSON" in message
                message = assert_error(await http.post("/store/dequeue", json={"worker_id": 5}), 422, "invalid_request")
                assert "worker_id" in message
                many_wrong = {"rollouts": [{"task": {"input": 1}, "max_attempts": "many", "timeout_s": "x"}]}
                message = assert_error(await http.post("/store/enqueue", json=many_wrong), 422, "invalid_request")
                assert "rollouts.0.max_attempts" in message and "1 more" in message
                assert_error(await http.get("/store/rollouts", params={"status": "lost"}), 422, "invalid_request")
                assert_error(await http.get("/store/resources/latest-ish"), 422, "invalid_request")
                assert_error(await http.get("/store/rollouts/ro-missing"), 404, "not_found")
                assert_error(await http.post("/store/attempts/at-missing/start"), 404, "not_found")
                assert_error(await http.get("/store/no-such-route"), 404, "not_found")
                stray = Span(rollout_id=queued.rollout_id, attempt_id="at-missing", name="x")
                body = {"spans": [s.model_dump(mode="json") for s in [*spans_for(claim, 1, "new"), stray]]}
                assert_error(await http.post("/store/spans", json=body), 404, "not_found")
                finish = f"/store/attempts/{aid}/finish"
                assert (await http.post(finish, json={"status": "succeeded", "reward": 1.0})).status_code == 200
                assert_error(await http.post(finish, json={"status": "failed"}), 409, "invalid_transition")
                assert_error(await http.post("/store/spans", content=b"x" * 5000), 413, "payload_too_large")

                async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: capped while streaming
                    for _ in range(10):
                        yield b"x" * 1000

                assert_error(await http.post("/store/spans", content=chunked()), 413, "payload_too_large")

                assert (await http.get("/health")).json() == {"status": "ok"}
                listed = await http.get("/store/rollouts", params={"status": ["succeeded", "queuing"], "limit": 5})
                assert [r["rollout_id"] for r in listed.json()] == [queued.rollout_id]
                every = await http.get(f"/store/rollouts/{queued.rollout_id}/spans", params={"attempt_id": "all"})
                assert len(every.json()) == 3

            rollout, spans = await store.get_rollout(queued.rollout_id), await store.query_spans(queued.rollout_id)
            assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 1.0
            assert (
                rollout.model_copy(update={"status": before[0].status, "reward": None, "ended_at": None}) == before[0]
            )
            assert spans == before[1]


class FaultyStore(MemoryStore):
    """A store with a bug in one method, and a watchdog pass that fails once."""

    def __init__(self) -> None:
        super().__init__()
        self.reaps = 0

    async def count_by_status(self) -> dict[RolloutStatus, int]:
        raise RuntimeError("boom\nwith a second line")

    async def reap_timed_out(self, at: float | None = None, *, write_id: str | None = None) -> list[Attempt]:
        self.reaps += 1
        if self.reaps == 1:
            raise RuntimeError("the watchdog trips once")
        return await super().reap_timed_out(at, write_id=write_id)


async def test_unexpected_errors_are_500_and_the_server_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    store = FaultyStore()
    with StoreServer(store, watchdog_interval_s=0.02) as server:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            message = assert_error(await http.get("/store/counts"), 500, "store_error")
            assert "boom" in message
        async with StoreClient(server.url) as client:
            with pytest.raises(StoreError, match="boom"):
                await client.count_by_status()
            [queued] = await client.enqueue(rollouts(1, heartbeat_timeout_s=0.05))
            assert await client.dequeue("w") is not None
            deadline = time.monotonic() + 5
            while (await client.get_rollout(queued.rollout_id)).status is not RolloutStatus.TIMEOUT:
                assert time.monotonic() < deadline, "the watchdog stopped after its first failure"
                await asyncio.sleep(0.02)
    assert store.reaps > 1
    assert any("boom" in r.getMessage() or "boom" in str(r.exc_info) for r in caplog.records)


# -- retries ----------------------------------------------------------------------------------


async def test_client_waits_for_a_server_that_starts_late() -> None:
    port = free_port()
    server = StoreServer(MemoryStore(), port=port, watchdog_interval_s=None)
    starter = threading.Timer(0.5, server.start)
    started = time.monotonic()
    starter.start()
    try:
        async with StoreClient(f"http://127.0.0.1:{port}") as client:
            [queued] = await client.enqueue(rollouts(1))
            assert time.monotonic() - started >= 0.4
            assert (await client.get_rollout(queued.rollout_id)).status is RolloutStatus.QUEUING
    finally:
        starter.join()
        server.stop()


async def test_client_gives_up_quickly_without_a_server() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    async with StoreClient(url, max_retries=2, backoff_s=0.01) as client:
        with pytest.raises(StoreUnavailableError) as raised:
            await client.count_by_status()
    assert time.monotonic() - started < 2.0
    assert url in str(raised.value) and "\n" not in str(raised.value)


async def test_a_retried_span_batch_is_stored_once(server: StoreServer, client: StoreClient) -> None:
    await client.enqueue(rollouts(1))
    claim = await client.dequeue("w")
    assert claim is not None
    async with Relay(server, drop=b"POST /store/spans") as relay, StoreClient(relay.url) as flaky:
        assert await flaky.add_spans(spans_for(claim, 10)) == 10  # the server remembers its first answer
        assert relay.dropped == 1 and relay.count(b"POST /store/spans") == 2
    stored = await client.query_spans(claim.rollout.rollout_id)
    assert [s.name for s in stored] == [f"call-{i}" for i in range(10)]
    assert [s.sequence_id for s in stored] == list(range(1, 11))


async def test_a_retried_dequeue_returns_the_same_claim(server: StoreServer, client: StoreClient) -> None:
    first, _ = await client.enqueue(rollouts(2))
    async with Relay(server, drop=b"POST /store/dequeue") as relay, StoreClient(relay.url) as flaky:
        claim = await flaky.dequeue("w")
        assert relay.dropped == 1 and relay.count(b"POST /store/dequeue") == 2
    assert claim is not None and claim.rollout.rollout_id == first.rollout_id
    counts = await client.count_by_status()
    assert counts[RolloutStatus.RUNNING] == 1 and counts[RolloutStatus.QUEUING] == 1
    assert await client.list_attempts(first.rollout_id) == [claim.attempt]


# -- batching ---------------------------------------------------------------------------------


async def test_concurrent_add_spans_share_requests(server: StoreServer, client: StoreClient) -> None:
    await client.enqueue(rollouts(5))
    claims = [c for c in [await client.dequeue("w") for _ in range(5)] if c is not None]
    async with Relay(server) as relay, StoreClient(relay.url) as batched:
        calls = [batched.add_spans(spans_for(claims[i % 5], 10, f"c{i}")) for i in range(50)]
        stray = Span(rollout_id=claims[0].rollout.rollout_id, attempt_id="at-missing", name="stray")
        results = await asyncio.gather(*calls, batched.add_spans([stray]), return_exceptions=True)
        assert results[:50] == [10] * 50  # each caller gets its own count...
        assert isinstance(results[50], NotFoundError)  # ...and its own error
        assert relay.count(b"POST /store/spans") < 50
    for claim in claims:
        stored = await client.query_spans(claim.rollout.rollout_id)
        assert len(stored) == 100 and len({s.span_id for s in stored}) == 100


async def test_add_spans_nowait_then_flush(server: StoreServer) -> None:
    async with StoreClient(server.url, span_batch_size=100) as client:
        await client.enqueue(rollouts(2))
        claims = [c for c in [await client.dequeue("w"), await client.dequeue("w")] if c is not None]
        assert len(claims) == 2
        written = {c.attempt.attempt_id: spans_for(c, 250) for c in claims}
        for i in range(250):  # two attempts writing span by span, interleaved
            for spans in written.values():
                client.add_spans_nowait([spans[i]])
        client.add_spans_nowait([Span(rollout_id=claims[0].rollout.rollout_id, attempt_id="at-missing", name="x")])
        with pytest.raises(NotFoundError):
            await client.flush()
        await client.flush()  # the error was reported once
        for claim in claims:
            stored = await client.query_spans(claim.rollout.rollout_id)
            assert [s.name for s in stored] == [f"call-{i}" for i in range(250)]  # in write order
            assert [s.sequence_id for s in stored] == list(range(1, 251))
        client.add_spans_nowait(spans_for(claims[0], 5, "late"))  # close() flushes what is buffered
    async with StoreClient(server.url) as reader:
        assert len(await reader.query_spans(claims[0].rollout.rollout_id)) == 255


async def test_a_batch_over_the_size_limit_is_split() -> None:
    with StoreServer(MemoryStore(), max_body_bytes=4000, watchdog_interval_s=None) as server:
        async with StoreClient(server.url) as client:
            await client.enqueue(rollouts(1))
            claim = await client.dequeue("w")
            assert claim is not None
            assert await client.add_spans(spans_for(claim, 12, attributes={"text": "x" * 500})) == 12
            assert len(await client.query_spans(claim.rollout.rollout_id)) == 12
            with pytest.raises(PayloadTooLargeError):
                await client.add_spans(spans_for(claim, 1, "huge", attributes={"text": "x" * 5000}))


async def test_wait_outlasts_the_client_timeout(client: StoreClient, server: StoreServer) -> None:
    [queued] = await client.enqueue(rollouts(1))
    async with StoreClient(server.url, timeout_s=0.2, max_retries=0) as impatient:
        started = time.monotonic()
        assert await impatient.wait_for_rollouts([queued.rollout_id], timeout=0.6) == []
        assert time.monotonic() - started >= 0.5


# -- many processes ---------------------------------------------------------------------------


def dequeue_until_empty(url: str, worker: str, barrier: Any, results: Any) -> None:
    """A runner process: claim and finish rollouts until none is left; report what it claimed."""

    async def run() -> list[tuple[str, str]]:
        claimed = []
        async with StoreClient(url) as store:
            await store.count_by_status()  # connected before the race starts
            barrier.wait()
            while (claim := await store.dequeue(worker)) is not None:
                claimed.append((claim.rollout.rollout_id, claim.attempt.attempt_id))
                await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        return claimed

    results.put((worker, asyncio.run(run())))


async def test_processes_never_share_a_rollout(server: StoreServer, client: StoreClient) -> None:
    queued = await client.enqueue(rollouts(200))
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    workers = [
        context.Process(target=dequeue_until_empty, args=(server.url, f"w{i}", barrier, results)) for i in range(4)
    ]
    for process in workers:
        process.start()
    claimed: dict[str, list[tuple[str, str]]] = dict(
        await asyncio.to_thread(lambda: [results.get(timeout=60) for _ in workers])
    )
    for process in workers:
        process.join(10)
    pairs = [pair for worker in claimed.values() for pair in worker]
    assert len(pairs) == 200
    assert {rid for rid, _ in pairs} == {r.rollout_id for r in queued}
    assert len({aid for _, aid in pairs}) == 200
    assert sum(1 for worker in claimed.values() if worker) >= 2
    assert (await client.count_by_status())[RolloutStatus.SUCCEEDED] == 200


# -- the CLI entry point ----------------------------------------------------------------------


def test_serve_stops_cleanly_on_ctrl_c(tmp_path: Any) -> None:
    port, closed = free_port(), tmp_path / "closed"
    script = textwrap.dedent(f"""
        from alight.store import MemoryStore
        from alight.store.server import serve

        class Store(MemoryStore):
            async def close(self):
                open({str(closed)!r}, "w").close()

        serve(Store(), port={port}, watchdog_interval_s=None)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
        assert closed.exists()
    finally:
        if process.poll() is None:
            process.kill()


def test_serve_on_a_taken_port_fails_in_one_line_and_closes_the_store() -> None:
    closed = []

    class Store(MemoryStore):
        async def close(self) -> None:
            closed.append(True)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}") as raised:
            serve(Store(), port=port, watchdog_interval_s=None)
    assert "\n" not in str(raised.value) and closed == [True]
