"""The HTTP store client: a `Store` that talks to `alight.store.server` over keep-alive HTTP.

Requests go through an `aiohttp` session. Why not httpx, the rest of the stack's HTTP client:
measured here on a 2-core machine, httpx's async request path costs ~670 us of client CPU per call
(~400 us even over its aiohttp transport) against ~120 us for aiohttp; with 8 runner processes
sharing the cores with the server, that cuts the store's throughput from ~450 to ~140 rollout
cycles/s (benchmarks/store_bench.py).

Connection failures and 503 answers are retried with exponential backoff and jitter; every
retried call is safe (enqueue is idempotent by rollout id, dequeue always carries an attempt id,
finishes are idempotent, span and resource writes carry an idempotency key). Spans from
concurrent callers are coalesced into batched requests, sent one at a time in call order so the
store numbers each attempt's spans in the order they were written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from pydantic import TypeAdapter
from yarl import URL

from alight.errors import (
    ERRORS_BY_CODE,
    AlightError,
    ConfigError,
    InvalidRequestError,
    InvalidTransitionError,
    NotFoundError,
    PayloadTooLargeError,
    StoreError,
    StoreUnavailableError,
)
from alight.store.base import Store
from alight.types import (
    Attempt,
    AttemptStatus,
    Claim,
    Resource,
    ResourceSet,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    new_id,
)

logger = logging.getLogger(__name__)

#: Header naming a write whose answer the server remembers, so a retried write is not applied twice.
IDEMPOTENCY_HEADER = "idempotency-key"

_ROLLOUT: TypeAdapter[Rollout] = TypeAdapter(Rollout)
_ROLLOUTS: TypeAdapter[list[Rollout]] = TypeAdapter(list[Rollout])
_ATTEMPT: TypeAdapter[Attempt] = TypeAdapter(Attempt)
_ATTEMPTS: TypeAdapter[list[Attempt]] = TypeAdapter(list[Attempt])
_CLAIM: TypeAdapter[Claim | None] = TypeAdapter(Claim | None)
_SPANS: TypeAdapter[list[Span]] = TypeAdapter(list[Span])
_RESOURCES: TypeAdapter[dict[str, Resource]] = TypeAdapter(dict[str, Resource])
_RESOURCE_SET: TypeAdapter[ResourceSet] = TypeAdapter(ResourceSet)
_MAYBE_RESOURCE_SET: TypeAdapter[ResourceSet | None] = TypeAdapter(ResourceSet | None)

# Errors worth another try: the request may not have reached the store, or its answer was lost.
# A read timeout is not among them: the server got the request and is slow, trying again adds load.
_RETRIED = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
_BY_STATUS: dict[int, type[AlightError]] = {
    404: NotFoundError,
    409: InvalidTransitionError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    503: StoreUnavailableError,
}


def one_line(text: str, limit: int = 1000) -> str:
    """`text` on one line (whitespace runs collapsed), cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _raised(status: int, error: Any, fallback: str) -> AlightError:
    """The exception the server raised, from its `{"code", "message"}` error object."""
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        cls = ERRORS_BY_CODE.get(error["code"]) or _BY_STATUS.get(status, StoreError)
        return cls(one_line(str(error.get("message", ""))))
    return _BY_STATUS.get(status, StoreError)(one_line(fallback))


@dataclass(eq=False)
class _Group:
    """Spans written by one call, stored by one `add_spans` on the server. `future` gets the
    count or the error; None for `add_spans_nowait`. A flush marker has no spans: it is released
    once everything queued before it is acknowledged."""

    spans: list[Span]
    future: asyncio.Future[int] | None
    marker: bool = False


class StoreClient(Store):
    """A `Store` over HTTP. Create it anywhere; it opens its connections lazily on first use,
    inside the running event loop. Ignores proxy environment variables: the store is reached
    directly."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 6,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        span_batch_size: int = 1000,
        span_flush_interval_s: float = 0.05,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.span_batch_size = max(1, span_batch_size)
        self.span_flush_interval_s = span_flush_interval_s
        target = URL(self.url)
        if target.scheme not in ("http", "https") or not target.host:
            raise ConfigError(f"bad store URL {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Span batching, all on `_loop`.
        self._queue: deque[_Group] = deque()
        self._queued_nowait = 0  # spans of nowait groups in the queue
        self._waiters = 0  # groups in the queue that someone awaits (calls and flushes)
        self._open: dict[str, _Group] = {}  # attempt id -> nowait group still taking spans
        self._oldest = 0.0  # loop time when the oldest buffered nowait span arrived
        self._wake: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
        self._background_errors: list[AlightError] = []

    # -- transport ------------------------------------------------------------------------
    def _bind(self) -> None:
        """Open the HTTP session inside the running loop (again, if the loop changed)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        # Keep-alive shorter than the server's (30 s), so the client is the side that closes.
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=15.0)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        self._queue.clear()
        self._open.clear()
        self._queued_nowait = self._waiters = 0
        self._wake, self._sender = asyncio.Event(), None

    async def _send(
        self, method: str, path: str, body: bytes, key: str | None, read_timeout: float | None
    ) -> tuple[int, bytes]:
        """One try: the answer's status and body."""
        assert self._session is not None
        headers = {"content-type": "application/json"}
        if key is not None:
            headers[IDEMPOTENCY_HEADER] = key
        timeout = aiohttp.ClientTimeout(
            connect=self.timeout_s, sock_read=self.timeout_s if read_timeout is None else read_timeout
        )
        url = URL(self.url + path, encoded=True)
        async with self._session.request(method, url, data=body, headers=headers, timeout=timeout) as response:
            return response.status, await response.read()

    def _backoff(self, retry: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1)) * random.uniform(0.5, 1.0))

    async def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        read_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> bytes:
        """One request with retries; the answer's body, or the server's error raised."""
        self._bind()
        last = ""
        for retry in range(self.max_retries + 1):
            if retry:
                await asyncio.sleep(self._backoff(retry))
            try:
                status, content = await self._send(method, path, body or b"", idempotency_key, read_timeout)
            except aiohttp.ConnectionTimeoutError as err:
                last = f"connect timeout: {err}"
                continue
            except (aiohttp.ServerTimeoutError, TimeoutError):
                raise StoreUnavailableError(f"the store at {self.url} did not answer {method} {path} in time") from None
            except _RETRIED as err:
                last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
                continue
            except aiohttp.ClientError as err:
                raise StoreError(one_line(f"{method} {self.url}{path} failed: {err}")) from None
            if status < 400:
                return content
            try:
                error = orjson.loads(content).get("error")
            except (orjson.JSONDecodeError, AttributeError):
                error = None
            fallback = f"HTTP {status} from {method} {self.url}{path}: {content[:200].decode(errors='replace')}"
            if status == 503:
                last = str(_raised(status, error, fallback))
                continue
            raise _raised(status, error, fallback)
        raise StoreUnavailableError(
            one_line(f"the store at {self.url} is unreachable after {self.max_retries + 1} tries: {last}")
        )

    # -- queue ----------------------------------------------------------------------------
    async def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        body = b'{"rollouts":' + _ROLLOUTS.dump_json(list(rollouts)) + b"}"
        return _ROLLOUTS.validate_json(await self._call("POST", "/store/enqueue", body))

    async def dequeue(self, worker_id: str | None = None, *, attempt_id: str | None = None) -> Claim | None:
        # Always name the attempt, so a retried request returns the same claim.
        body = orjson.dumps({"worker_id": worker_id, "attempt_id": attempt_id or new_id("at")})
        return _CLAIM.validate_json(await self._call("POST", "/store/dequeue", body))

    async def start_attempt(self, attempt_id: str) -> Attempt:
        return _ATTEMPT.validate_json(await self._call("POST", f"/store/attempts/{_quote(attempt_id)}/start"))

    async def heartbeat(self, attempt_id: str) -> Attempt:
        path = f"/store/attempts/{_quote(attempt_id)}/heartbeat"
        return _ATTEMPT.validate_json(await self._call("POST", path))

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
    ) -> Rollout:
        body = orjson.dumps({"status": status, "reward": reward, "error": error})
        path = f"/store/attempts/{_quote(attempt_id)}/finish"
        return _ROLLOUT.validate_json(await self._call("POST", path, body))

    async def finish_rollout(self, rollout_id: str, status: RolloutStatus, *, reward: float | None = None) -> Rollout:
        body = orjson.dumps({"status": status, "reward": reward})
        path = f"/store/rollouts/{_quote(rollout_id)}/finish"
        return _ROLLOUT.validate_json(await self._call("POST", path, body))

    # -- spans ----------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Write spans; returns how many were new once the server has stored them.

        Concurrent calls share requests, but each call is stored by its own `add_spans` on the
        server, so its count and its errors are its own. A call of more than `span_batch_size`
        spans is sent as several parts: if one part is refused, the others may be stored.
        """
        spans = list(spans)
        if not spans:
            return 0
        self._bind()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[int]] = []
        size = self.span_batch_size
        for begin in range(0, len(spans), size):
            future: asyncio.Future[int] = loop.create_future()
            group = _Group(spans[begin : begin + size], future)
            for span in group.spans:  # later nowait spans of these attempts must go after this call
                self._open.pop(span.attempt_id, None)
            self._push(group)
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(results)  # type: ignore[arg-type]

    def add_spans_nowait(self, spans: Sequence[Span]) -> None:
        """Buffer spans for a background write (when `span_batch_size` are buffered, else within
        `span_flush_interval_s`). Must be called inside the running loop; errors come from `flush`."""
        self._bind()
        for span in spans:
            group = self._open.get(span.attempt_id)
            if group is None or len(group.spans) >= self.span_batch_size:
                # One group per attempt: an unknown attempt loses only its own spans.
                group = self._open[span.attempt_id] = _Group([], None)
                self._push(group)
            group.spans.append(span)
            self._queued_nowait += 1
        if self._queued_nowait >= self.span_batch_size and self._wake is not None:
            self._wake.set()

    async def flush(self) -> None:
        """Return once every buffered span is acknowledged; raise the first error a background
        write hit since the last flush."""
        self._bind()
        marker = _Group([], asyncio.get_running_loop().create_future(), marker=True)
        self._push(marker)
        assert marker.future is not None
        await marker.future
        if self._background_errors:
            first, self._background_errors = self._background_errors[0], []
            raise first

    def _push(self, group: _Group) -> None:
        if not self._queue:
            self._oldest = asyncio.get_running_loop().time()
        self._queue.append(group)
        if group.future is not None:
            self._waiters += 1
        assert self._wake is not None
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_spans(), name="alight-span-sender")

    async def _send_spans(self) -> None:
        """The one sender: batches go out one at a time, in the order their spans were written."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._waiters and self._queued_nowait < self.span_batch_size:
                delay = self._oldest + self.span_flush_interval_s - loop.time()
                if delay > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
                    continue
            batch = self._take_batch()
            if batch:
                try:
                    results = await self._post_groups([group.spans for group in batch])
                except Exception as err:  # never let the sender die: its callers would hang
                    logger.exception("span write to %s failed", self.url)
                    results = [StoreError(one_line(f"span write failed: {type(err).__name__}: {err}"))]
                    results *= len(batch)
                for group, result in zip(batch, results, strict=True):
                    self._settle(group, result)

    def _take_batch(self) -> list[_Group]:
        """Groups from the front of the queue, up to `span_batch_size` spans; releases flush
        markers reached with nothing sent before them."""
        batch: list[_Group] = []
        count = 0
        while self._queue:
            group = self._queue[0]
            if group.marker:
                if batch:
                    break
                self._queue.popleft()
                self._settle(group, 0)
                continue
            if batch and count + len(group.spans) > self.span_batch_size:
                break
            self._queue.popleft()
            if group.future is None:
                self._queued_nowait -= len(group.spans)
                if self._open.get(group.spans[0].attempt_id) is group:
                    del self._open[group.spans[0].attempt_id]
            batch.append(group)
            count += len(group.spans)
        self._oldest = asyncio.get_running_loop().time()
        return batch

    def _settle(self, group: _Group, result: int | AlightError) -> None:
        if group.future is None:
            if isinstance(result, AlightError):
                logger.warning("background write of %d spans to %s failed: %s", len(group.spans), self.url, result)
                self._background_errors.append(result)
            return
        self._waiters -= 1
        if group.future.done():  # the caller was cancelled
            return
        if isinstance(result, AlightError):
            group.future.set_exception(result)
        else:
            group.future.set_result(result)

    async def _post_groups(self, groups: list[list[Span]]) -> list[int | AlightError]:
        """Each group's count or error. A batch over the server's size limit is split in halves."""
        try:
            return await self._post_span_request(groups)
        except PayloadTooLargeError as err:
            if sum(map(len, groups)) <= 1:
                return [err] * len(groups)
            if len(groups) > 1:
                middle = len(groups) // 2
                return await self._post_groups(groups[:middle]) + await self._post_groups(groups[middle:])
            half = len(groups[0]) // 2
            parts = await self._post_groups([groups[0][:half]]) + await self._post_groups([groups[0][half:]])
            failed = [part for part in parts if isinstance(part, AlightError)]
            return [failed[0] if failed else sum(parts)]  # type: ignore[arg-type]
        except AlightError as err:
            return [err] * len(groups)

    async def _post_span_request(self, groups: list[list[Span]]) -> list[int | AlightError]:
        every = [span for group in groups for span in group]
        sizes = orjson.dumps([len(group) for group in groups])
        body = b'{"spans":' + _SPANS.dump_json(every) + b',"groups":' + sizes + b"}"
        answer = orjson.loads(await self._call("POST", "/store/spans", body, idempotency_key=new_id("rq")))
        results: list[int | AlightError] = []
        for item in answer["groups"]:
            error = item.get("error")
            results.append(_raised(200, error, str(error)) if error is not None else int(item["added"]))
        return results

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        path = f"/store/rollouts/{_quote(rollout_id)}/spans"
        if attempt_id is not None:
            path += f"?attempt_id={_quote(attempt_id)}"
        return _SPANS.validate_json(await self._call("GET", path))

    # -- reading --------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        return _ROLLOUT.validate_json(await self._call("GET", f"/store/rollouts/{_quote(rollout_id)}"))

    async def list_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        ids: Sequence[str] | None = None,
        mode: RolloutMode | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        query = {
            "status": None if status is None else list(status),
            "ids": None if ids is None else list(ids),
            "mode": mode,
            "group_id": group_id,
            "limit": limit,
            "offset": offset,
        }
        return _ROLLOUTS.validate_json(await self._call("POST", "/store/rollouts/query", orjson.dumps(query)))

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        path = f"/store/rollouts/{_quote(rollout_id)}/attempts"
        return _ATTEMPTS.validate_json(await self._call("GET", path))

    async def count_by_status(self) -> dict[RolloutStatus, int]:
        counts = orjson.loads(await self._call("GET", "/store/counts"))
        return {status: int(counts.get(status.value, 0)) for status in RolloutStatus}

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float) -> list[Rollout]:
        body = orjson.dumps({"rollout_ids": list(rollout_ids), "timeout": max(timeout, 0.0)})
        # The server holds the request up to `timeout`; the read may take that long plus a margin.
        raw = await self._call("POST", "/store/wait", body, read_timeout=max(timeout, 0.0) + self.timeout_s)
        return _ROLLOUTS.validate_json(raw)

    # -- resources ------------------------------------------------------------------------
    async def add_resources(self, resources: Mapping[str, Resource]) -> ResourceSet:
        body = b'{"resources":' + _RESOURCES.dump_json(dict(resources)) + b"}"
        raw = await self._call("POST", "/store/resources", body, idempotency_key=new_id("rq"))
        return _RESOURCE_SET.validate_json(raw)

    async def get_latest_resources(self) -> ResourceSet | None:
        return _MAYBE_RESOURCE_SET.validate_json(await self._call("GET", "/store/resources/latest"))

    async def get_resources(self, version: int) -> ResourceSet:
        return _RESOURCE_SET.validate_json(await self._call("GET", f"/store/resources/{int(version)}"))

    # -- upkeep ---------------------------------------------------------------------------
    async def reap_timed_out(self, at: float | None = None) -> list[Attempt]:
        raw = await self._call("POST", "/store/reap", orjson.dumps({"at": at}), idempotency_key=new_id("rq"))
        return _ATTEMPTS.validate_json(raw)

    async def close(self) -> None:
        """Flush buffered spans, then close the connections; raises what `flush` raises."""
        if self._loop is None:
            return
        same_loop = self._loop is asyncio.get_running_loop()
        try:
            if same_loop and (self._queue or self._background_errors):
                await self.flush()
        finally:
            session, sender = self._session, self._sender
            self._session = self._sender = self._loop = None
            if sender is not None and same_loop:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            for group in self._queue:  # written while closing: nobody will send them
                if group.future is not None and not group.future.done():
                    group.future.set_exception(StoreError("the store client closed before these spans were sent"))
            self._queue.clear()
            self._open.clear()
            self._queued_nowait = self._waiters = 0
            if session is not None and same_loop:
                await session.close()


def _quote(identifier: str) -> str:
    return quote(identifier, safe="")
