"""Coalesce span writes from many callers into few requests, sent in the order they were written.

Used by the HTTP store client: a tracer calls `add_nowait` on every span and `flush` at the end of
an attempt; concurrent `add` calls share requests but each caller still gets its own count or
error. One sender task sends one batch at a time, so the store numbers each attempt's spans in
the order they were written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from alight.errors import AlightError, StoreError, one_line
from alight.types import Span

logger = logging.getLogger(__name__)

#: Sends groups of spans in one request; returns each group's count of new spans, or its error.
PostGroups = Callable[[list[list[Span]]], Awaitable[list[int | AlightError]]]


@dataclass(eq=False)
class _Group:
    """Spans written by one call, stored by one `add_spans` on the server. `future` gets the
    count or the error; None for `add_nowait`. A flush marker has no spans: it is released once
    everything queued before it is acknowledged."""

    spans: list[Span]
    future: asyncio.Future[int] | None
    marker: bool = False


class SpanBatcher:
    """A queue of span groups and the one task that sends them. Lives on one event loop."""

    def __init__(self, post: PostGroups, batch_size: int, flush_interval_s: float, target: str) -> None:
        self._post = post
        self._batch_size = max(1, batch_size)
        self._flush_interval_s = flush_interval_s
        self._target = target  # where the spans go, for log lines
        self._queue: deque[_Group] = deque()
        self._queued_nowait = 0  # spans of nowait groups in the queue
        self._waiters = 0  # groups in the queue that someone awaits (calls and flushes)
        self._open: dict[str, _Group] = {}  # attempt id -> nowait group still taking spans
        self._oldest = 0.0  # loop time when the oldest buffered nowait span arrived
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._background_errors: list[AlightError] = []

    @property
    def pending(self) -> bool:
        """True while spans wait to be sent or a background error waits to be reported."""
        return bool(self._queue or self._background_errors)

    async def add(self, spans: Sequence[Span]) -> int:
        """Queue spans and wait until they are stored; how many were new."""
        spans = list(spans)
        if not spans:
            return 0
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[int]] = []
        for begin in range(0, len(spans), self._batch_size):
            future: asyncio.Future[int] = loop.create_future()
            group = _Group(spans[begin : begin + self._batch_size], future)
            for span in group.spans:  # later nowait spans of these attempts must go after this call
                self._open.pop(span.attempt_id, None)
            self._push(group)
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(results)  # type: ignore[arg-type]

    def add_nowait(self, spans: Sequence[Span]) -> None:
        """Queue spans for a background write; errors are reported by `flush`."""
        for span in spans:
            group = self._open.get(span.attempt_id)
            if group is None or len(group.spans) >= self._batch_size:
                # One group per attempt: an unknown attempt loses only its own spans.
                group = self._open[span.attempt_id] = _Group([], None)
                self._push(group)
            group.spans.append(span)
            self._queued_nowait += 1
        if self._queued_nowait >= self._batch_size:
            self._wake.set()

    async def flush(self) -> None:
        """Return once every queued span is acknowledged; raise the first error a background
        write hit since the last flush."""
        marker = _Group([], asyncio.get_running_loop().create_future(), marker=True)
        self._push(marker)
        assert marker.future is not None
        await marker.future
        if self._background_errors:
            first, self._background_errors = self._background_errors[0], []
            raise first

    async def close(self) -> None:
        """Stop the sender; callers still waiting get a StoreError (nothing will send their spans)."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        for group in self._queue:
            if group.future is not None and not group.future.done():
                group.future.set_exception(StoreError("the store client closed before these spans were sent"))
        self._queue.clear()
        self._open.clear()
        self._queued_nowait = self._waiters = 0

    def _push(self, group: _Group) -> None:
        if not self._queue:
            self._oldest = asyncio.get_running_loop().time()
        self._queue.append(group)
        if group.future is not None:
            self._waiters += 1
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="alight-span-sender")

    async def _send(self) -> None:
        """The one sender: batches go out one at a time, in the order their spans were written."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._waiters and self._queued_nowait < self._batch_size:
                delay = self._oldest + self._flush_interval_s - loop.time()
                if delay > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
                    continue
            batch = self._take_batch()
            if batch:
                try:
                    results = await self._post([group.spans for group in batch])
                except Exception as err:  # never let the sender die: its callers would hang
                    logger.exception("span write to %s failed", self._target)
                    results = [StoreError(f"span write failed: {one_line(err)}")]
                    results *= len(batch)
                for group, result in zip(batch, results, strict=True):
                    self._settle(group, result)

    def _take_batch(self) -> list[_Group]:
        """Groups from the front of the queue, up to the batch size in spans; releases flush
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
            if batch and count + len(group.spans) > self._batch_size:
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
                logger.warning("background write of %d spans to %s failed: %s", len(group.spans), self._target, result)
                self._background_errors.append(result)
            return
        self._waiters -= 1
        if group.future.done():  # the caller was cancelled
            return
        if isinstance(result, AlightError):
            group.future.set_exception(result)
        else:
            group.future.set_result(result)
