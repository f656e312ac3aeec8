"""Instrumentation of the `anthropic` SDK: proxy headers on every request, LLM spans for the rest.

`instrument_anthropic()` patches `SyncAPIClient.request` / `AsyncAPIClient.request` of the SDK once
per process (one call per API call, retries included); nothing happens outside an attempt.

- A request to an alight proxy route (a base URL `{proxy}/rollout/{rollout_id}/attempt/{attempt_id}`,
  which is what `LLM.anthropic_base_url` gives, or the rollout/attempt id headers) gets the headers
  that place the proxy's LLM span in the attempt: agent name, parent span, trace id and the call's
  sequence number (a request that already carries `HEADER_SEQUENCE_ID` keeps it).
- A `POST /v1/messages` to any other endpoint (Anthropic's own API, a gateway) is recorded as an
  LLM span by the client (`llm.source="client"`, `llm.api="anthropic"`), in the chat shape the proxy
  records: the request as chat messages and tools, the answer as an assistant message with its tool
  calls, the usage, no token ids. Plain answers and streams (`stream=True`, `messages.stream()`) are
  followed; a raw or lazy response (`with_raw_response`, `with_streaming_response`) ends the span
  without its answer.
- For any endpoint, a `tool_result` block answering a `tool_use` the model asked for earlier in the
  attempt is recorded as a TOOL span (name, input, result), as for the openai SDK.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from alight import semconv
from alight.errors import one_line
from alight.tracing.anthropic_messages import Answer, request_attributes, text_of
from alight.tracing.context import ActiveSpan, _Frame, current_frame, jsonable, tool_attributes
from alight.types import SpanKind, SpanStatus

#: An alight proxy route bound to one attempt (Anthropic clients take it without `/v1`).
PROXY_ROUTE = re.compile(r"/rollout/[^/]+/attempt/[^/]+(?:/|$)")
MESSAGES_PATH = "/v1/messages"
_ID_HEADERS = frozenset({semconv.HEADER_ROLLOUT_ID, semconv.HEADER_ATTEMPT_ID})
#: Anthropic's stop reasons as OpenAI finish reasons (what the chat span records).
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k")
_installed = False


def instrument_anthropic() -> bool:
    """Patch the anthropic SDK (see the module doc); False when anthropic is not installed."""
    global _installed
    if _installed:
        return True
    try:
        from anthropic import _base_client
    except ImportError:
        return False
    _base_client.SyncAPIClient.request = _sync_request(_base_client.SyncAPIClient.request)  # type: ignore[method-assign]
    _base_client.AsyncAPIClient.request = _async_request(_base_client.AsyncAPIClient.request)  # type: ignore[method-assign]
    _installed = True
    return True


def _sync_request(request: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(request)
    def traced_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return request(self, *args, **kwargs)
        call = MessagesCall.start(frame, self, _options(args, kwargs), bool(kwargs.get("stream")))
        try:
            result = request(self, *args, **kwargs)
        except BaseException as err:
            if call is not None:
                call.fail(err)
            raise
        return result if call is None else call.received(result)

    return traced_request


def _async_request(request: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(request)
    async def traced_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return await request(self, *args, **kwargs)
        call = MessagesCall.start(frame, self, _options(args, kwargs), bool(kwargs.get("stream")))
        try:
            result = await request(self, *args, **kwargs)
        except BaseException as err:
            if call is not None:
                call.fail(err)
            raise
        return result if call is None else call.received(result)

    return traced_request


def _options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("options")


# -- proxy headers --------------------------------------------------------------------------------


def is_proxy_call(client: Any, options: Any) -> bool:
    """True when `client` sends this request to an alight proxy route, which records the call itself."""
    if PROXY_ROUTE.search(str(client.base_url)):
        return True
    url = str(getattr(options, "url", ""))
    if url[:4] == "http" and PROXY_ROUTE.search(url):
        return True
    return _names_attempt(client._custom_headers) or _names_attempt(getattr(options, "headers", None) or None)


def _names_attempt(headers: Mapping[str, Any] | None) -> bool:
    return bool(headers) and any(type(key) is str and key.lower() in _ID_HEADERS for key in headers)  # type: ignore[union-attr]


def _add_proxy_headers(frame: _Frame, options: Any) -> None:
    """Give a proxy-bound request (`FinalRequestOptions`, the SDK copies it) the attempt's headers."""
    headers = options.headers or None  # NotGiven when the caller passed none
    added = {semconv.HEADER_AGENT_NAME: frame.agent_name}
    if not headers or not any(type(key) is str and key.lower() == semconv.HEADER_SEQUENCE_ID for key in headers):
        added[semconv.HEADER_SEQUENCE_ID] = str(frame.attempt.next_sequence_id())  # else numbered already
    parent = frame.parent
    if parent is not None:
        added[semconv.HEADER_PARENT_SPAN_ID] = parent.span_id
        added[semconv.HEADER_TRACE_ID] = parent.trace_id
    options.headers = {**added, **headers} if headers else added  # the caller's own values win


# -- one Messages call --------------------------------------------------------------------------


class MessagesCall:
    """One `POST /v1/messages` inside an attempt: tool spans for the tool results it carries, its
    LLM span when the endpoint is not a proxy (`span`), the tool calls its answer asks for."""

    def __init__(self, frame: _Frame, span: ActiveSpan | None) -> None:
        self.frame = frame
        self.span = span
        self.started = time.perf_counter()
        self.done = False

    @classmethod
    def start(cls, frame: _Frame, client: Any, options: Any, stream: bool) -> MessagesCall | None:
        """Headers for a proxied request; a call to follow for a Messages request (else None)."""
        if options is None:
            return None
        proxied = is_proxy_call(client, options)
        body = options.json_data
        messages_call = str(options.method).lower() == "post" and str(options.url).endswith(MESSAGES_PATH)
        if messages_call and isinstance(body, Mapping):
            body = {key: jsonable(value) for key, value in body.items() if _is_given(value)}
            body["stream"] = stream or bool(body.get("stream"))
            _record_answered_tools(frame, body.get("messages") or [])  # before the call's own number
        else:
            body = None
        if proxied:
            _add_proxy_headers(frame, options)
        if body is None:
            return None
        span = None
        if not proxied:
            span = frame.attempt.start_span("llm.chat", SpanKind.LLM, request_attributes(body), frame=frame)
        return cls(frame, span)

    def fail(self, err: BaseException) -> None:
        self.done = True
        if self.span is not None:
            self.span.attributes[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
            self.span.end(SpanStatus.ERROR, one_line(err))

    def received(self, result: Any) -> Any:
        """Follow the SDK's answer to the end of the call; returns it unchanged."""
        if getattr(result, "type", None) == "message" and hasattr(result, "content"):
            self._finish(Answer.of_message(jsonable(result)))
        elif hasattr(result, "_iterator") and hasattr(result, "response"):  # Stream / AsyncStream
            answer = Answer()
            if hasattr(result._iterator, "__anext__"):
                result._iterator = self._awatch(result._iterator, answer)
            else:
                result._iterator = self._watch(result._iterator, answer)
        else:
            self._finish(None)
        return result

    def _watch(self, events: Iterator[Any], answer: Answer) -> Iterator[Any]:
        try:
            for event in events:
                answer.add(jsonable(event))
                yield event
        finally:
            self._finish(answer)

    async def _awatch(self, events: AsyncIterator[Any], answer: Answer) -> AsyncIterator[Any]:
        try:
            async for event in events:
                answer.add(jsonable(event))
                yield event
        finally:
            self._finish(answer)

    def _finish(self, answer: Answer | None) -> None:
        if self.done:
            return
        self.done = True
        message = answer.message() if answer is not None else None
        if message is not None:
            pending = self.frame.attempt.pending_tool_calls
            for call in message.get("tool_calls") or ():
                pending[call["id"]] = (call["function"]["name"], answer.inputs.get(call["id"]) if answer else None)
        span = self.span
        if span is None:
            return
        attrs = span.attributes
        if answer is not None and message is not None:
            attrs[semconv.LLM_RESPONSE_MESSAGE] = message
            if answer.stop_reason is not None:
                attrs[semconv.LLM_FINISH_REASON] = _FINISH.get(answer.stop_reason, answer.stop_reason)
            if answer.model is not None:
                attrs[semconv.LLM_RESPONSE_MODEL] = answer.model
            if answer.usage:
                prompt, completion = answer.usage.get("input_tokens") or 0, answer.usage.get("output_tokens") or 0
                attrs[semconv.LLM_USAGE] = {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                }
        attrs[semconv.LLM_LATENCY_S] = time.perf_counter() - self.started
        span.end()


def _record_answered_tools(frame: _Frame, messages: list[Any]) -> None:
    """A TOOL span for each tool result that answers a tool call the model made in this attempt."""
    attempt = frame.attempt
    if not attempt.pending_tool_calls:
        return
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user" or isinstance(message.get("content"), str):
            continue
        for block in message.get("content") or ():
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = block.get("tool_use_id")
            pending = attempt.pending_tool_calls.pop(call_id, None) if call_id else None
            if pending is None:
                continue
            name, arguments = pending
            error = bool(block.get("is_error"))
            attrs = tool_attributes(name, arguments, text_of(block.get("content")), error=error, call_id=call_id)
            attempt.record(name, SpanKind.TOOL, attrs, status=SpanStatus.ERROR if error else SpanStatus.OK, frame=frame)


def _is_given(value: Any) -> bool:
    # The SDK marks omitted arguments with sentinels (NOT_GIVEN / omit) that are not JSON.
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")
