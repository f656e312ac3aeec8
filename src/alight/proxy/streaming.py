"""Streamed chat calls: the engine's deltas as OpenAI chunks (or Responses API events, see
`responses_api`), and the same span as unstreamed.

The call holds the weight gate from before its first event until its stream ends, however it ends
(finished, failed, or the client went away), and its span is written once at that moment.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from alight.engines.base import ChatRequest, Generation, StreamEvent, TextDelta
from alight.proxy import completion_objects as objects
from alight.proxy.protocol import ChatBody, ProxyError
from alight.proxy.proxy import Proxy, engine_error
from alight.proxy.recorder import CallContext, llm_span

logger = logging.getLogger(__name__)


class EventStream(StreamingResponse):
    """A server-sent-events response that runs `on_end` once it is over, even when its body never
    started (the client left first): that releases the call's place in the weight gate."""

    def __init__(self, events: AsyncIterator[bytes], on_end: Callable[[], Awaitable[None]] | None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_end is not None:
                await self._on_end()


class EngineStream:
    """One streamed call to the engine's chat: `open` (errors before the first byte are plain HTTP
    errors), `events` (the SSE body, in the wire format a subclass writes in `_chunks`), `close`
    (idempotent: releases the gate, records the span)."""

    api = "chat"  # the OpenAI API the client called, recorded on the span

    def __init__(self, proxy: Proxy, context: CallContext, request: ChatRequest) -> None:
        self.proxy = proxy
        self.context = context
        self.request = request
        self.version: int | None = None
        self.generation: Generation | None = None
        self.message: dict[str, Any] | None = None
        self.error: str | None = None
        self._events: AsyncIterator[StreamEvent] | None = None
        self._first: StreamEvent | None = None
        self._started = time.time()
        self._clock = time.perf_counter()
        self._inside = False
        self._closed = False

    async def open(self) -> None:
        self.version = await self.proxy.gate.enter()
        self._inside = True
        self._started, self._clock = time.time(), time.perf_counter()
        self._events = self.proxy.engine.chat_stream(self.request)
        try:
            self._first = await anext(self._events)
        except Exception as err:
            failure = engine_error(err)
            self.error = str(failure)
            await self.close()
            raise failure from None

    async def events(self) -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(self._chunks(self._answer())) as chunks:
                async for chunk in chunks:
                    yield chunk
        except Exception as err:  # the engine failed mid-answer: tell the client in the stream
            failure = engine_error(err)
            self.error = str(failure)
            logger.error("proxy: streamed call failed: %s", failure)
            yield self._error_event(failure)
        finally:
            await self.close()

    async def _answer(self) -> AsyncIterator[StreamEvent]:
        """The engine's deltas, then its `Generation` (kept, with the answered message, for the span)."""
        assert self._events is not None and self._first is not None
        event = self._first
        while isinstance(event, TextDelta):
            yield event
            event = await anext(self._events)
        self.generation = event
        self.message = objects.assistant_message(event.message)
        yield event

    def _chunks(self, answer: AsyncIterator[StreamEvent]) -> AsyncGenerator[bytes, None]:
        """The SSE body of `answer`: `self.message` is set when its `Generation` arrives."""
        raise NotImplementedError

    def _error_event(self, failure: ProxyError) -> bytes:
        return objects.sse({"error": _error_fields(failure)})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        except Exception:
            logger.exception("proxy: closing the engine's stream failed")
        finally:
            if self._inside:
                self.proxy.gate.leave()
            self._record(time.perf_counter() - self._clock)

    def _record(self, latency: float) -> None:
        if not self.context.recorded:
            logger.debug("proxy: streamed %s call without rollout/attempt ids: served, not recorded", self.api)
            return
        error = self.error
        if error is None and self.generation is None:
            error = "the client disconnected before the answer was complete"
        span = llm_span(
            self.context,
            self.request,
            stream=True,
            started=self._started,
            latency_s=latency,
            version=self.version,
            generation=self.generation,
            message=self.message,
            error=error,
            api=self.api,
        )
        self.proxy.recorder.record(span)


class ChatStream(EngineStream):
    """One streamed chat completion, in OpenAI's chunk format."""

    def __init__(self, proxy: Proxy, context: CallContext, request: ChatRequest, body: ChatBody) -> None:
        super().__init__(proxy, context, request)
        self.body = body
        self.chunks = objects.ChatChunks(objects.new_call_id("chatcmpl"), request.model, body.include_usage)

    async def _chunks(self, answer: AsyncIterator[StreamEvent]) -> AsyncGenerator[bytes, None]:
        yield self.chunks.first()
        async for event in answer:
            if isinstance(event, TextDelta):
                if event.text:
                    yield self.chunks.text(event.text)
                continue
            assert self.message is not None
            for chunk in self.chunks.tool_calls(self.message):
                yield chunk
            logprobs = objects.logprobs_content(event, self.proxy.token_texts) if self.body.logprobs else None
            alight = None
            if self.body.return_token_ids:
                alight = objects.extension(event, self.version, self.context.recorded_span_id)
            for chunk in self.chunks.last(event, logprobs=logprobs, alight=alight):
                yield chunk


def _error_fields(err: ProxyError) -> dict[str, Any]:
    return {"message": str(err), "type": err.type, "param": err.param, "code": err.code}
