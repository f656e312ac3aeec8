"""OpenAI's Responses API (`POST /v1/responses`) on top of the engine's chat.

A Responses request is translated into the `ChatRequest` a chat completion would have made
(`instructions` as the system message, message items as chat messages, `function_call` items as
the assistant's `tool_calls`, `function_call_output` items as `tool` messages, flat function tools
as chat tools, `text.format` as `response_format`), so the call goes through the chat path (weight
gate, engine errors, default sampling) and is recorded as a chat span with `llm.api` "responses":
the adapter reads it like any other. The answer comes back as a `response` object, or streamed as
the Responses API's events.

The proxy keeps no state between calls: `previous_response_id`, `conversation` and stored
`prompt` templates are refused with a 400, as are tools other than functions and input items
other than messages, function calls and their outputs. `store`, `metadata`, `include`,
`reasoning`, `truncation` and the like are accepted and ignored.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from alight.engines.base import ChatRequest, Generation, StreamEvent, TextDelta
from alight.proxy import completion_objects as objects
from alight.proxy.protocol import (
    Content,
    FunctionDef,
    Message,
    ProxyError,
    _Sampled,
    _Strict,
    validation_error,
)
from alight.proxy.proxy import Proxy
from alight.proxy.recorder import CallContext
from alight.proxy.streaming import EngineStream

API = "responses"

#: Responses API fields a stateless proxy cannot honour: they name state kept by OpenAI.
_STATEFUL = ("previous_response_id", "conversation", "prompt")

#: Responses API fields the proxy accepts and ignores (never passed on to the engine).
_IGNORED = frozenset(
    {
        "store",
        "metadata",
        "include",
        "parallel_tool_calls",
        "truncation",
        "reasoning",
        "user",
        "safety_identifier",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "context_management",
        "top_logprobs",
        "max_tool_calls",
        "background",
        "stream_options",
    }
)


class _InputMessage(Message):
    """A message item: text parts only (`input_text`, `output_text`)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Content


class _FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class _FunctionOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Content


class ResponsesBody(_Sampled):
    """POST /v1/responses."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(default=None, alias="max_output_tokens")
    parallel_tool_calls: bool = True

    def to_request(self) -> ChatRequest:
        """The chat request this call makes to the engine, or a 400 naming what cannot be served."""
        for name in _STATEFUL:
            if (self.model_extra or {}).get(name) is not None:
                raise ProxyError(
                    f"'{name}' is not supported: the alight proxy keeps no state between calls, "
                    "send the whole conversation in 'input'.",
                    param=name,
                    code="unsupported_parameter",
                )
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += _chat_messages(self.input)
        if not messages:
            raise ProxyError("'input' is empty.", param="input", code="invalid_value")
        tools = _chat_tools(self.tools or [])
        return ChatRequest(
            model=self.model,
            messages=messages,
            tools=tools or None,
            tool_choice=_chat_tool_choice(self.tool_choice, tools),
            response_format=_response_format(self.text),
            sampling=self.sampling(self.max_tokens),
            extra=self.extra(),
        )

    def extra(self) -> dict[str, Any]:
        return {key: value for key, value in super().extra().items() if key not in _IGNORED and key not in _STATEFUL}

    def text_format(self) -> dict[str, Any]:
        return (self.text or {}).get("format") or {"type": "text"}


def _chat_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{index}]"
        _check_text_parts(item, "content" if kind == "message" else "output", where)
        try:
            if kind == "message":
                plain = _InputMessage.model_validate(item).plain()
                messages.append({"role": plain["role"], "content": plain["content"]})
            elif kind == "function_call":
                call = _FunctionCallItem.model_validate(item)
                tool_call = {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":  # text and calls of one answer
                    last.setdefault("tool_calls", []).append(tool_call)
                else:
                    messages.append({"role": "assistant", "tool_calls": [tool_call]})
            elif kind == "function_call_output":
                result = _FunctionOutputItem.model_validate(item)
                output = result.output
                content = output if isinstance(output, str) else "".join(part.text for part in output)
                messages.append({"role": "tool", "tool_call_id": result.call_id, "content": content})
            else:
                raise ProxyError(
                    f"Input items of type '{kind}' are not supported by the alight proxy "
                    "(it takes message, function_call and function_call_output items).",
                    param=f"{where}.type",
                    code="unsupported_value",
                )
        except ValidationError as err:
            raise validation_error(err, prefix=where) from None
    return messages


def _check_text_parts(item: dict[str, Any], field: str, where: str) -> None:
    """Images, files and audio have no place in a text model's prompt: say so by name."""
    content = item.get(field)
    for index, part in enumerate(content if isinstance(content, list) else []):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind is not None and kind not in ("input_text", "output_text", "text"):
            raise ProxyError(
                f"Content parts of type '{kind}' are not supported by the alight proxy: text only.",
                param=f"{where}.{field}[{index}].type",
                code="unsupported_value",
            )


def _chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat function tools as chat tools; any other tool type is refused, all of them named."""
    others = sorted({str(tool.get("type")) for tool in tools if tool.get("type") != "function"})
    if others:
        raise ProxyError(
            f"Tools of type {', '.join(repr(kind) for kind in others)} are not supported by the alight proxy: "
            "only function tools are.",
            param="tools",
            code="unsupported_value",
        )
    chat = []
    for index, tool in enumerate(tools):
        try:
            function = FunctionDef.model_validate({key: value for key, value in tool.items() if key != "type"})
        except ValidationError as err:
            raise validation_error(err, prefix=f"tools[{index}]") from None
        chat.append({"type": "function", "function": function.model_dump(exclude_none=True)})
    return chat


def _chat_tool_choice(choice: str | dict[str, Any] | None, tools: list[dict[str, Any]]) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise ProxyError(
            f"tool_choice of type {choice.get('type')!r} is not supported: use 'none', 'auto', 'required' "
            "or a function.",
            param="tool_choice",
            code="unsupported_value",
        )
    name = choice.get("name")
    if not isinstance(name, str) or name not in {tool["function"]["name"] for tool in tools}:
        raise ProxyError(f"tool_choice names an unknown function {name!r}.", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        schema = {key: value for key, value in fmt.items() if key != "type"}
        return {"type": "json_schema", "json_schema": schema}
    return dict(fmt)


# -- the answer -----------------------------------------------------------------------------------


def output_items(message: dict[str, Any], *, message_id: str, status: str) -> list[dict[str, Any]]:
    """The answered assistant message as output items: its text as a `message`, then each tool
    call as a `function_call` (its `call_id` is the chat tool call's id, as recorded)."""
    items: list[dict[str, Any]] = []
    if message.get("content"):
        items.append(_message_item(message_id, message["content"], status))
    for call in message.get("tool_calls") or []:
        items.append(_call_item(call))
    return items


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status != "in_progress" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "id": "fc-" + call["id"].removeprefix("call-"),
        "type": "function_call",
        "status": "completed",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"],
    }


def status_of(generation: Generation) -> str:
    return "incomplete" if generation.finish_reason == "length" else "completed"


def response_object(
    response_id: str,
    body: ResponsesBody,
    created_at: float,
    *,
    output: list[dict[str, Any]],
    generation: Generation | None = None,
    alight: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `response` object: in progress (no generation yet), completed or incomplete."""
    status = status_of(generation) if generation is not None else "in_progress"
    usage = None
    if generation is not None:
        usage = {
            "input_tokens": generation.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": generation.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        }
    answer: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_tokens,
        "model": generation.model if generation is not None else body.model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": None,
        "store": False,
        "temperature": body.temperature,
        "text": {"format": body.text_format()},
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": usage,
        "metadata": (body.model_extra or {}).get("metadata") or {},  # echoed, as OpenAI does
    }
    if alight is not None:
        answer["alight"] = alight
    return answer


class ResponsesStream(EngineStream):
    """One streamed Responses API call: `response.created`, the output items' events, then
    `response.completed` (or `response.incomplete` when the token limit cut the answer)."""

    api = API

    def __init__(self, proxy: Proxy, context: CallContext, request: ChatRequest, body: ResponsesBody) -> None:
        super().__init__(proxy, context, request)
        self.body = body
        self.response_id = objects.new_call_id("resp")
        self.created_at = time.time()
        self._sequence = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\n".encode() + objects.sse(data)

    def _error_event(self, failure: ProxyError) -> bytes:
        return self._event("error", code=failure.code, message=str(failure), param=failure.param)

    def _open_message(self, message_id: str) -> list[bytes]:
        at = {"item_id": message_id, "output_index": 0, "content_index": 0}
        return [
            self._event(
                "response.output_item.added", output_index=0, item=_message_item(message_id, "", "in_progress")
            ),
            self._event("response.content_part.added", **at, part=_text_part("")),
        ]

    async def _chunks(self, answer: AsyncIterator[StreamEvent]) -> AsyncGenerator[bytes, None]:
        started = response_object(self.response_id, self.body, self.created_at, output=[])
        yield self._event("response.created", response=started)
        yield self._event("response.in_progress", response=started)
        message_id = objects.new_call_id("msg")
        at = {"item_id": message_id, "output_index": 0, "content_index": 0}
        streamed: list[str] = []
        generation: Generation | None = None
        async for event in answer:
            if not isinstance(event, TextDelta):
                generation = event
            elif event.text:
                if not streamed:
                    for opening in self._open_message(message_id):
                        yield opening
                streamed.append(event.text)
                yield self._event("response.output_text.delta", **at, delta=event.text, logprobs=[])
        assert generation is not None and self.message is not None
        message = self.message
        if streamed and not message.get("content"):  # keep the text the client was sent
            message = {**message, "content": "".join(streamed)}
        status = status_of(generation)
        output = output_items(message, message_id=message_id, status=status)
        for index, item in enumerate(output):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                if not streamed:  # the engine sent its text in the final message only
                    for opening in self._open_message(message_id):
                        yield opening
                    yield self._event("response.output_text.delta", **at, delta=text, logprobs=[])
                yield self._event("response.output_text.done", **at, text=text, logprobs=[])
                yield self._event("response.content_part.done", **at, part=_text_part(text))
            else:
                added = {**item, "status": "in_progress", "arguments": ""}
                yield self._event("response.output_item.added", output_index=index, item=added)
                call = {"item_id": item["id"], "output_index": index}
                if item["arguments"]:
                    yield self._event("response.function_call_arguments.delta", **call, delta=item["arguments"])
                yield self._event(
                    "response.function_call_arguments.done", **call, name=item["name"], arguments=item["arguments"]
                )
            yield self._event("response.output_item.done", output_index=index, item=item)
        alight = None
        if self.body.return_token_ids:
            alight = objects.extension(generation, self.version, self.context.recorded_span_id)
        final = response_object(
            self.response_id, self.body, self.created_at, output=output, generation=generation, alight=alight
        )
        yield self._event(f"response.{final['status']}", response=final)
