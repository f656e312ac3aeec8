"""Anthropic's Messages API (`POST /v1/messages`) on top of the engine's chat.

A Messages request is translated into the `ChatRequest` a chat completion would have made
(`system` as the system message, text blocks as message text, `tool_use` blocks as the assistant's
`tool_calls` with their input as JSON arguments, `tool_result` blocks as `tool` messages, tools'
`input_schema` as chat tools' `parameters`, `tool_choice` auto/any/tool/none as auto/required/the
function/none, `stop_sequences` as `stop`, `output_config.format` as `response_format`), so the call
goes through the chat path (weight gate, engine errors, default sampling) and is recorded as a chat
span with `llm.api` "anthropic": the adapter reads it like any other. The answer comes back as a
`message` (text and `tool_use` blocks, `stop_reason`, `usage`), or streamed as Anthropic's events.

Errors on these routes are Anthropic's: `{"type": "error", "error": {"type", "message"}}` with the
status the type goes with. Images, documents, server tools (web search, code execution, ...) are
refused with a 400; `thinking`, `metadata`, `service_tier`, cache control and the like are accepted
and ignored. `top_k` travels to the engine in `extra`. A `stop_reason` of "stop_sequence" (and the
sequence) is reported where the engine's tokenizer shows which stop sequence ended the answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from alight.engines.base import ChatRequest, Generation, StreamEvent, TextDelta
from alight.errors import AlightError, one_line
from alight.proxy import completion_objects as objects
from alight.proxy.anthropic_request import MessagesBody
from alight.proxy.completion_objects import TokenTexts
from alight.proxy.protocol import ProxyError
from alight.proxy.proxy import Proxy
from alight.proxy.recorder import CallContext
from alight.proxy.streaming import EngineStream
from alight.serving.app import AnsweredError

logger = logging.getLogger(__name__)

API = "anthropic"

#: Anthropic's error type for each status it answers with (others: by class, see `error_type`).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


class AnthropicError(AnsweredError):
    """An error answered as `{"type": "error", "error": {"type", "message"}}`."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    def fields(self) -> dict[str, Any]:
        return {"type": error_type(self.status), "message": one_line(str(self))}

    def body(self) -> bytes:
        return orjson.dumps({"type": "error", "error": self.fields()})


def anthropic_error_body(status: int, code: str | None, message: str) -> bytes:
    """An error of the proxy's app on an Anthropic route (unknown method, auth, body too large)."""
    return AnthropicError(message, status=status).body()


def as_anthropic(err: ProxyError | AlightError) -> AnthropicError:
    """A proxy or engine error in Anthropic's shape, with the same status."""
    status = err.status if isinstance(err, ProxyError) else err.http_status
    return AnthropicError(str(err), status=status)


# -- the answer ---------------------------------------------------------------------------------------


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The answered assistant message (OpenAI's shape) as Anthropic content blocks: its text, then a
    `tool_use` block per tool call (its id the chat tool call's, as recorded; its input parsed)."""
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"] or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):  # Anthropic's input is an object: keep what the model wrote
            logger.warning("proxy: tool call %r has arguments that are not a JSON object", function["name"])
            arguments = {"arguments": function["arguments"]}
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments})
    return blocks


def stop_of(generation: Generation, stops: list[str], token_texts: TokenTexts | None) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a generation."""
    if generation.finish_reason == "length":
        return "max_tokens", None
    if generation.finish_reason == "tool_calls":
        return "tool_use", None
    ids = generation.response_token_ids
    if stops and ids and token_texts is not None:
        rest = "".join(token_texts(ids))[len(generation.text) :]  # what came after the answered text
        hits = [(rest.find(stop), stop) for stop in stops if stop in rest]
        if hits:
            return "stop_sequence", min(hits)[1]
    return "end_turn", None


def usage(generation: Generation | None) -> dict[str, int]:
    return {
        "input_tokens": generation.prompt_tokens if generation is not None else 0,
        "output_tokens": generation.completion_tokens if generation is not None else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_object(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    *,
    generation: Generation | None = None,
    stop: tuple[str | None, str | None] = (None, None),
    alight: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `message` object: empty and unfinished (no generation yet, for `message_start`), or the answer."""
    answer: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": generation.model if generation is not None else model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage(generation),
    }
    if alight is not None:
        answer["alight"] = alight
    return answer


def new_message_id() -> str:
    return objects.new_call_id("msg").replace("-", "_")


class MessagesStream(EngineStream):
    """One streamed Messages call: `message_start`, each content block's start/delta/stop, then
    `message_delta` (stop reason, usage) and `message_stop`. Text streams as the engine writes
    it; a tool call's input arrives as one `input_json_delta` once the answer is complete."""

    api = API

    def __init__(self, proxy: Proxy, context: CallContext, request: ChatRequest, body: MessagesBody) -> None:
        super().__init__(proxy, context, request)
        self.body = body
        self.message_id = new_message_id()

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\n".encode() + objects.sse({"type": kind, **fields})

    def _error_event(self, failure: ProxyError) -> bytes:
        return self._event("error", error=as_anthropic(failure).fields())

    async def _chunks(self, answer: AsyncIterator[StreamEvent]) -> AsyncGenerator[bytes, None]:
        yield self._event("message_start", message=message_object(self.message_id, self.request.model, []))
        streamed: list[str] = []
        generation: Generation | None = None
        async for event in answer:
            if not isinstance(event, TextDelta):
                generation = event
            elif event.text:
                if not streamed:
                    yield self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                streamed.append(event.text)
                yield self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": event.text})
        assert generation is not None and self.message is not None
        message = self.message
        if streamed and not message.get("content"):  # keep the text the client was sent
            message = {**message, "content": "".join(streamed)}
        for index, block in enumerate(content_blocks(message)):
            if block["type"] == "text":
                if not streamed:  # the engine sent its text in the final message only
                    yield self._event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    yield self._event(
                        "content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]}
                    )
            else:
                yield self._event("content_block_start", index=index, content_block={**block, "input": {}})
                partial = json.dumps(block["input"], ensure_ascii=False)
                yield self._event(
                    "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
                )
            yield self._event("content_block_stop", index=index)
        reason, sequence = stop_of(generation, self.request.sampling.stop, self.proxy.token_texts)
        extra: dict[str, Any] = {}
        if self.body.return_token_ids:
            extra["alight"] = objects.extension(generation, self.version, self.context.recorded_span_id)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield self._event("message_delta", delta=delta, usage=usage(generation), **extra)
        yield self._event("message_stop")
