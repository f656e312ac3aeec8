"""Instrumentation of the `openai` SDK's chat completions (sync, async, streamed).

`instrument_openai()` patches `Completions.create` and `AsyncCompletions.create` once per process;
the patch does nothing outside an attempt. Inside one, a call to an alight proxy URL only gets
headers (agent name, parent span, trace id, sequence number: the proxy writes the LLM span with
token ids); a call to any other endpoint is recorded here as an LLM span with
`llm.source="client"`. Either way the response's tool calls are remembered, and when a later
request answers them with `role: tool` messages, a TOOL span per answered call is recorded first
(for plain-Python agents that run tools without telling alight).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from alight import semconv
from alight.tracing.context import ActiveSpan, _Frame, current_frame, jsonable, tool_attributes
from alight.types import SpanKind, SpanStatus

logger = logging.getLogger(__name__)

#: The path of an alight proxy route bound to one attempt.
PROXY_PATH = re.compile(r"/rollout/[^/]+/attempt/[^/]+/v1")
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
)
_installed = False


def instrument_openai() -> bool:
    """Patch the openai SDK's chat completions; False when openai is not installed."""
    global _installed
    if _installed:
        return True
    try:
        from openai.resources.chat.completions import completions as module
    except ImportError:
        return False
    sync_create = module.Completions.create
    async_create = module.AsyncCompletions.create

    @functools.wraps(sync_create)
    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return sync_create(self, *args, **kwargs)
        call = _Call(frame, self._client, kwargs)
        try:
            result = sync_create(self, *args, **call.kwargs)
        except BaseException as err:
            call.fail(err)
            raise
        return call.received(result)

    @functools.wraps(async_create)
    async def acreate(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return await async_create(self, *args, **kwargs)
        call = _Call(frame, self._client, kwargs)
        try:
            result = await async_create(self, *args, **call.kwargs)
        except BaseException as err:
            call.fail(err)
            raise
        return call.received(result)

    module.Completions.create = create  # type: ignore[method-assign]
    module.AsyncCompletions.create = acreate  # type: ignore[method-assign]
    _installed = True
    return True


def is_proxy_call(client: Any, extra_headers: Any) -> bool:
    """True when the client talks to an alight proxy route (which records the call itself)."""
    if PROXY_PATH.search(str(getattr(client, "base_url", ""))):
        return True
    headers = {**(getattr(client, "_custom_headers", None) or {}), **(extra_headers or {})}
    return any(key.lower() == semconv.HEADER_ATTEMPT_ID for key in headers)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


class _Call:
    """One chat completion call inside an attempt."""

    __slots__ = ("done", "frame", "kwargs", "proxied", "span", "started")

    def __init__(self, frame: _Frame, client: Any, kwargs: dict[str, Any]) -> None:
        self.frame = frame
        self.done = False
        attempt = frame.attempt
        messages = kwargs.get("messages")
        if messages is not None and not isinstance(messages, list):
            messages = list(messages)
            kwargs = {**kwargs, "messages": messages}
        if messages and attempt.pending_tool_calls:
            self._record_answered_tools(messages)
        sequence_id = attempt.next_sequence_id()  # after the tool spans: they happened before this call
        self.proxied = is_proxy_call(client, kwargs.get("extra_headers"))
        self.span: ActiveSpan | None = None
        if self.proxied:
            parent = frame.parent
            headers = {semconv.HEADER_AGENT_NAME: frame.agent_name, semconv.HEADER_SEQUENCE_ID: str(sequence_id)}
            if parent is not None:
                headers[semconv.HEADER_PARENT_SPAN_ID] = parent.span_id
                headers[semconv.HEADER_TRACE_ID] = parent.trace_id
            extra = kwargs.get("extra_headers")
            kwargs = {**kwargs, "extra_headers": {**headers, **extra} if extra else headers}
        else:
            attrs = _request_attributes(kwargs)
            self.span = attempt.start_span("llm.chat", SpanKind.LLM, attrs, frame=frame, sequence_id=sequence_id)
        self.kwargs = kwargs
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

    def received(self, result: Any) -> Any:
        """Handle the SDK's answer: a completion, a stream, or a raw response."""
        from openai import AsyncStream, Stream

        if isinstance(result, Stream | AsyncStream):
            # The span ends when the stream is consumed, or closed (directly or by `with`) early.
            assembler = _StreamAssembler()
            if isinstance(result, Stream):
                close = result.close
                result._iterator = self._watch(result._iterator, assembler)

                def close_sync() -> None:
                    self._finish(*assembler.result())
                    close()

                result.close = close_sync  # type: ignore[method-assign]
            else:
                aclose = result.close
                result._iterator = self._awatch(result._iterator, assembler)

                async def close_async() -> None:
                    self._finish(*assembler.result())
                    await aclose()

                result.close = close_async  # type: ignore[method-assign]
            return result
        completion = result
        if not hasattr(result, "choices"):  # with_raw_response: parsing is cached, the caller gets the same object
            parse = getattr(result, "parse", None)
            try:
                completion = parse() if callable(parse) else None
            except Exception:  # the caller will see the same error when it parses
                completion = None
            if isinstance(completion, Stream | AsyncStream):
                completion = None  # a raw streamed answer: not followed
        if completion is None or not getattr(completion, "choices", None):
            self._finish(None, None, None, None)
            return result
        choice = completion.choices[0]
        usage = getattr(completion, "usage", None)
        self._finish(
            _message_dict(choice.message),
            choice.finish_reason,
            getattr(completion, "model", None),
            None if usage is None else usage.model_dump(mode="json", exclude_none=True),
        )
        return result

    def fail(self, err: BaseException) -> None:
        self.done = True
        if self.span is not None:
            self.span.attributes[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
            self.span.end(SpanStatus.ERROR, " ".join(f"{type(err).__name__}: {err}".split())[:1000])

    def _finish(self, message: dict[str, Any] | None, finish_reason: Any, model: Any, usage: Any) -> None:
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
        if finish_reason is not None:
            attrs[semconv.LLM_FINISH_REASON] = str(finish_reason)
        if model is not None:
            attrs[semconv.LLM_RESPONSE_MODEL] = str(model)
        if usage:
            attrs[semconv.LLM_USAGE] = usage
        attrs[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
        span.end()

    # -- streams: the span ends when the stream is consumed (or dropped) ------------------
    def _watch(self, chunks: Iterator[Any], assembler: _StreamAssembler) -> Iterator[Any]:
        try:
            for chunk in chunks:
                assembler.add(chunk)
                yield chunk
        finally:
            self._finish(*assembler.result())

    async def _awatch(self, chunks: AsyncIterator[Any], assembler: _StreamAssembler) -> AsyncIterator[Any]:
        try:
            async for chunk in chunks:
                assembler.add(chunk)
                yield chunk
        finally:
            self._finish(*assembler.result())


class _StreamAssembler:
    """Builds the assistant message of a streamed answer from its chunks."""

    def __init__(self) -> None:
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

    def result(self) -> tuple[dict[str, Any], str | None, str | None, dict[str, Any] | None]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message, self.finish_reason, self.model, self.usage


def _message_dict(message: Any) -> dict[str, Any]:
    """An assistant message as plain OpenAI JSON: role, content and tool calls only."""
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


def _request_attributes(kwargs: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        semconv.LLM_SOURCE: "client",
        semconv.LLM_TOKEN_IDS_SOURCE: "none",
        semconv.LLM_REQUEST_MESSAGES: [_plain_message(message) for message in kwargs.get("messages") or ()],
        semconv.LLM_STREAM: bool(kwargs.get("stream") or False),
    }
    model = kwargs.get("model")
    if isinstance(model, str):
        attrs[semconv.LLM_REQUEST_MODEL] = model
    tools = kwargs.get("tools")
    if tools and isinstance(tools, list | tuple):
        attrs[semconv.LLM_REQUEST_TOOLS] = jsonable(list(tools))
    sampling = {key: kwargs[key] for key in _SAMPLING_KEYS if _is_given(kwargs.get(key))}
    if sampling:
        attrs[semconv.LLM_REQUEST_SAMPLING] = jsonable(sampling)
    return attrs


def _is_given(value: Any) -> bool:
    # The SDK marks omitted arguments with sentinels (NOT_GIVEN / omit) that are not JSON.
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")
