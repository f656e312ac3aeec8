"""One openai SDK call inside an attempt: its LLM span, and the tool calls it answers or makes.

`LLMCall` follows one call of `chat.completions.create`/`parse` or the legacy `completions.create`
whatever the SDK hands back: a completion, a stream (plain or under the `stream()` helpers), a raw
response (`with_raw_response`) or a lazy one (`with_streaming_response`). For a call to an endpoint
that is not an alight proxy it records the LLM span (`llm.source="client"`); for any call it
remembers the answer's tool calls, and records a TOOL span for each one a later request answers.
(This module imports openai: only `instrument_openai` loads it.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from openai import AsyncStream, Stream
from openai._legacy_response import LegacyAPIResponse
from openai._response import APIResponse, AsyncAPIResponse

from alight import semconv
from alight.errors import one_line
from alight.tracing.context import ActiveSpan, _Frame, jsonable, tool_attributes
from alight.types import SpanKind, SpanStatus

#: (message, text, finish reason, model, usage): what a call's span records about its answer.
Answer = tuple[dict[str, Any] | None, str | None, str | None, str | None, dict[str, Any] | None]
_NO_ANSWER: Answer = (None, None, None, None, None)


class LLMCall:
    """One chat (`chat=True`) or text completion call; `span` is None for proxied calls, whose
    span the proxy writes."""

    __slots__ = ("assembler", "chat", "done", "frame", "hooked", "kwargs", "reading", "span", "started")

    def __init__(self, frame: _Frame, kwargs: dict[str, Any], *, chat: bool, proxied: bool) -> None:
        self.frame = frame
        self.chat = chat
        self.done = False
        self.reading = False  # inside the SDK's own read: a response closed now is not closed early
        self.hooked = False
        self.assembler: StreamAssembler | None = None
        attempt = frame.attempt
        if chat:
            messages = kwargs.get("messages")
            if messages is not None and not isinstance(messages, list):
                messages = list(messages)
                kwargs = {**kwargs, "messages": messages}
            if messages and attempt.pending_tool_calls:
                self._record_answered_tools(messages)
        self.kwargs = kwargs
        self.span: ActiveSpan | None = None
        if not proxied:  # after the tool spans: they happened before this call
            attrs = _chat_request(kwargs) if chat else _text_request(kwargs)
            self.span = attempt.start_span("llm.chat" if chat else "llm.completion", SpanKind.LLM, attrs, frame=frame)
        self.started = time.perf_counter()

    def _record_answered_tools(self, messages: list[Any]) -> None:
        attempt = self.frame.attempt
        for message in messages:
            if _get(message, "role") != "tool":
                continue
            call_id = _get(message, "tool_call_id")
            pending = attempt.pending_tool_calls.pop(call_id, None) if call_id else None
            if pending is None:
                continue
            name, arguments = pending
            attrs = tool_attributes(name, arguments, _content_text(_get(message, "content")), call_id=call_id)
            attempt.record(name, SpanKind.TOOL, attrs, frame=self.frame)

    # -- what the SDK hands back ------------------------------------------------------------
    def received(self, result: Any) -> Any:
        """Follow the SDK's answer to the end of the call; returns it unchanged."""
        if hasattr(result, "choices"):
            self._completed(result)
        elif isinstance(result, Stream | AsyncStream):
            self._follow(result)
        elif isinstance(result, LegacyAPIResponse):  # with_raw_response: parse() is cached, the caller gets the same
            try:
                parsed = result.parse()
            except Exception:  # the caller will see the same error when it parses
                parsed = None
            self._parsed(parsed)
        elif isinstance(result, APIResponse | AsyncAPIResponse):  # with_streaming_response: the body is not read yet
            self._watch_response(result)
        else:
            self._finish(*_NO_ANSWER)
        return result

    def fail(self, err: BaseException) -> None:
        self.done = True
        if self.span is not None:
            self.span.attributes[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
            self.span.end(SpanStatus.ERROR, one_line(err))

    def _parsed(self, parsed: Any) -> None:
        if isinstance(parsed, Stream | AsyncStream):
            self._follow(parsed)
        else:
            self._completed(parsed)

    def _completed(self, completion: Any) -> None:
        choices = getattr(completion, "choices", None)
        if not choices:
            self._finish(*_NO_ANSWER)
            return
        choice = choices[0]
        usage = getattr(completion, "usage", None)
        self._finish(
            _message_dict(choice.message) if self.chat else None,
            None if self.chat else getattr(choice, "text", None),
            choice.finish_reason,
            getattr(completion, "model", None),
            None if usage is None else usage.model_dump(mode="json", exclude_none=True),
        )

    def _finish(
        self, message: dict[str, Any] | None, text: str | None, finish_reason: Any, model: Any, usage: Any
    ) -> None:
        if self.done:
            return
        self.done = True
        if message is not None:
            pending = self.frame.attempt.pending_tool_calls
            for tool_call in message.get("tool_calls") or ():
                function = tool_call.get("function") or {}
                if tool_call.get("id"):
                    pending[tool_call["id"]] = (function.get("name") or "", function.get("arguments"))
        span = self.span
        if span is None:
            return
        attrs = span.attributes
        if message is not None:
            attrs[semconv.LLM_RESPONSE_MESSAGE] = message
        if text is not None:
            attrs[semconv.LLM_RESPONSE_TEXT] = text
        if finish_reason is not None:
            attrs[semconv.LLM_FINISH_REASON] = str(finish_reason)
        if model is not None:
            attrs[semconv.LLM_RESPONSE_MODEL] = str(model)
        if usage:
            attrs[semconv.LLM_USAGE] = usage
        attrs[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
        span.end()

    # -- streams: the span ends when the stream is consumed, or its response closed early --
    def _follow(self, stream: Stream[Any] | AsyncStream[Any]) -> None:
        if self.assembler is not None:
            return  # already followed (a cached parse)
        self.assembler = StreamAssembler(self.chat)
        if isinstance(stream, Stream):
            stream._iterator = self._watch(stream._iterator, self.assembler)
        else:
            stream._iterator = self._awatch(stream._iterator, self.assembler)
        self._hook_close(stream.response, isinstance(stream, AsyncStream))

    def _end_early(self) -> None:
        # Every way to drop a stream (Stream.close, `with`, the stream() helpers' managers) closes
        # the HTTP response; the SDK and httpx also close it at the natural end, while still reading.
        if not self.reading:
            self._finish(*(_NO_ANSWER if self.assembler is None else self.assembler.result()))

    def _hook_close(self, response: Any, is_async: bool) -> None:
        if self.hooked:
            return
        self.hooked = True
        if is_async:
            aclose = response.aclose

            async def aclose_hooked() -> None:
                self._end_early()
                await aclose()

            response.aclose = aclose_hooked
        else:
            close = response.close

            def close_hooked() -> None:
                self._end_early()
                close()

            response.close = close_hooked

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Mark the SDK as reading the body, so closing the response meanwhile is not an early end."""
        self.reading = True
        try:
            yield
        finally:
            self.reading = False

    def _seen(self, parsed: Any) -> Any:
        if not self.done:
            self._parsed(parsed)
        return parsed

    def _watch_response(self, response: APIResponse[Any] | AsyncAPIResponse[Any]) -> None:
        parse = response.parse
        if isinstance(response, AsyncAPIResponse):

            async def aparse(*args: Any, **kwargs: Any) -> Any:
                with self._reading():
                    parsed = await parse(*args, **kwargs)
                return self._seen(parsed)

            response.parse = aparse  # type: ignore[method-assign]
        else:

            def sync_parse(*args: Any, **kwargs: Any) -> Any:
                with self._reading():
                    parsed = parse(*args, **kwargs)
                return self._seen(parsed)

            response.parse = sync_parse  # type: ignore[method-assign]
        self._hook_close(response.http_response, isinstance(response, AsyncAPIResponse))

    def _watch(self, chunks: Iterator[Any], assembler: StreamAssembler) -> Iterator[Any]:
        try:
            while True:
                self.reading = True
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                finally:
                    self.reading = False
                assembler.add(chunk)
                yield chunk
        finally:
            self._finish(*assembler.result())

    async def _awatch(self, chunks: AsyncIterator[Any], assembler: StreamAssembler) -> AsyncIterator[Any]:
        try:
            while True:
                self.reading = True
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    self.reading = False
                assembler.add(chunk)
                yield chunk
        finally:
            self._finish(*assembler.result())


class StreamAssembler:
    """Builds the answer of a streamed call from its chunks (chat: the assistant message)."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage.model_dump(mode="json", exclude_none=True)
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index != 0:
                continue
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
            if not self.chat:
                self.content.append(getattr(choice, "text", None) or "")
                continue
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self.content.append(delta.content)
            for part in delta.tool_calls or ():
                call = self.tool_calls.setdefault(
                    part.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if part.id:
                    call["id"] = part.id
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""

    def result(self) -> Answer:
        if not self.chat:
            return None, "".join(self.content), self.finish_reason, self.model, self.usage
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message, None, self.finish_reason, self.model, self.usage


# -- request and response data as plain JSON ----------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _message_dict(message: Any) -> dict[str, Any]:
    """An assistant message as plain OpenAI JSON: role, content (a parsed answer's JSON text) and
    tool calls only."""
    out: dict[str, Any] = {"role": "assistant", "content": _get(message, "content")}
    tool_calls = _get(message, "tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": _get(call, "id"),
                "type": "function",
                "function": {
                    "name": _get(_get(call, "function"), "name"),
                    "arguments": _get(_get(call, "function"), "arguments"),
                },
            }
            for call in tool_calls
        ]
    return out


def _content_text(content: Any) -> Any:
    """A tool message's content: text parts joined, anything else as JSON data."""
    if isinstance(content, list):
        texts = [_get(part, "text") for part in content]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return jsonable(content)


def _plain_message(message: Any) -> Any:
    """A request message as JSON data; the common all-text dict is only copied (hot path)."""
    if type(message) is dict:
        for value in message.values():
            if value is not None and type(value) is not str:
                return jsonable(message)
        return message.copy()
    return jsonable(message)


def _common_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        semconv.LLM_SOURCE: "client",
        semconv.LLM_TOKEN_IDS_SOURCE: "none",
        semconv.LLM_STREAM: bool(kwargs.get("stream") or False),
    }
    model = kwargs.get("model")
    if isinstance(model, str):
        attrs[semconv.LLM_REQUEST_MODEL] = model
    sampling = {key: kwargs[key] for key in semconv.LLM_SAMPLING_KEYS if _is_given(kwargs.get(key))}
    if sampling:
        attrs[semconv.LLM_REQUEST_SAMPLING] = jsonable(sampling)
    return attrs


def _chat_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    attrs = _common_request(kwargs)
    attrs[semconv.LLM_REQUEST_MESSAGES] = [_plain_message(message) for message in kwargs.get("messages") or ()]
    tools = kwargs.get("tools")
    if tools and isinstance(tools, list | tuple):
        attrs[semconv.LLM_REQUEST_TOOLS] = jsonable(list(tools))
    return attrs


def _text_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    attrs = _common_request(kwargs)
    prompt = kwargs.get("prompt")
    if _is_given(prompt):
        attrs[semconv.LLM_REQUEST_PROMPT] = jsonable(prompt)
    return attrs


def _is_given(value: Any) -> bool:
    # The SDK marks omitted arguments with sentinels (NOT_GIVEN / omit) that are not JSON.
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")
