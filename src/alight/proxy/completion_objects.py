"""The OpenAI response side of the proxy: completion objects, stream chunks and log-probs.

Log-probs: the engine reports the log-prob of each sampled token only, so `top_logprobs` lists
come back empty whatever the request asks. Token ids are not part of OpenAI's format; a request
with `return_token_ids: true` (vLLM's flag) gets them the way vLLM answers that flag
(`prompt_token_ids` at the top level, `token_ids` on the choice), so the `litellm` engine and other
vLLM-aware clients read them from an alight server unchanged, and in an extra top-level `alight`
object that also says where the ids come from and which resources version served the call.
A streamed answer carries all its log-probs (and ids) in the finishing chunk: the engine streams
text pieces, not tokens. Clients that concatenate chunk log-probs (the openai SDK's stream
helpers, LangChain) end up with the same list as unstreamed.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson

from alight.engines.base import Generation

#: Turns token ids into their text pieces (one string per id), for OpenAI's log-probs format.
TokenTexts = Callable[[Sequence[int]], list[str]]


def new_call_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(12).hex()}"


def assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The engine's assistant message in OpenAI's shape: tool calls with ids, arguments as JSON text."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = orjson.dumps(arguments).decode()
        calls.append(
            {
                "id": call.get("id") or new_call_id("call"),
                "type": "function",
                "function": {"name": function.get("name", ""), "arguments": arguments},
            }
        )
    if calls:
        out["tool_calls"] = calls
        if not out["content"]:
            out["content"] = None
    elif out["content"] is None:
        out["content"] = ""
    return out


def usage(generation: Generation) -> dict[str, int]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }


def logprobs_content(generation: Generation, token_texts: TokenTexts | None) -> list[dict[str, Any]] | None:
    """OpenAI's `logprobs.content` list, or None when the engine gave no token ids or log-probs."""
    ids, logprobs = generation.response_token_ids, generation.response_logprobs
    if ids is None or logprobs is None or len(ids) != len(logprobs):
        return None
    texts = token_texts(ids) if token_texts is not None else [f"<|token:{i}|>" for i in ids]
    return [
        {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
        for text, logprob in zip(texts, logprobs, strict=True)
    ]


def extension(generation: Generation, version: int | None, span_id: str | None) -> dict[str, Any]:
    """The `alight` object: what a client needs to train on the call without the store."""
    return {
        "prompt_token_ids": generation.prompt_token_ids,
        "response_token_ids": generation.response_token_ids,
        "response_logprobs": generation.response_logprobs,
        "token_ids_source": generation.token_ids_source,
        "resources_version": version,
        "span_id": span_id,
    }


def chat_completion(
    call_id: str,
    generation: Generation,
    message: dict[str, Any],
    *,
    logprobs: list[dict[str, Any]] | None,
    alight: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": generation.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {**message, "refusal": None},
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": generation.finish_reason,
            }
        ],
        "usage": usage(generation),
    }
    if alight is not None:
        _add_ids(body, generation, alight)
    return body


def _add_ids(body: dict[str, Any], generation: Generation, alight: dict[str, Any]) -> None:
    """The token ids where vLLM puts them, and the `alight` object."""
    body["prompt_token_ids"] = generation.prompt_token_ids
    body["choices"][0]["token_ids"] = generation.response_token_ids
    body["alight"] = alight


class ChatChunks:
    """Server-sent events of one streamed chat completion, in OpenAI's chunk format."""

    def __init__(self, call_id: str, model: str, include_usage: bool) -> None:
        self.call_id = call_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def event(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.call_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None), "finish_reason": None}],
        }
        if "token_ids" in extra:
            chunk["choices"][0]["token_ids"] = extra.pop("token_ids")
        chunk["choices"][0]["finish_reason"] = finish_reason
        if self.include_usage:
            chunk["usage"] = None
        chunk.update(extra)
        return sse(chunk)

    def first(self) -> bytes:
        return self.event({"role": "assistant", "content": ""})

    def text(self, text: str) -> bytes:
        return self.event({"content": text})

    def tool_calls(self, message: dict[str, Any]) -> list[bytes]:
        """Each tool call as OpenAI streams it: id and name with empty arguments, then the arguments."""
        events = []
        for index, call in enumerate(message.get("tool_calls") or []):
            head = {"index": index, "id": call["id"], "type": "function"}
            events.append(
                self.event({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
            )
            args = call["function"]["arguments"]
            if args:
                events.append(self.event({"tool_calls": [{"index": index, "function": {"arguments": args}}]}))
        return events

    def last(
        self,
        generation: Generation,
        *,
        logprobs: list[dict[str, Any]] | None,
        alight: dict[str, Any] | None,
    ) -> list[bytes]:
        """The finishing chunk (with every log-prob of the answer), the usage chunk if asked, [DONE]."""
        extra: dict[str, Any] = {}
        if logprobs is not None:
            extra["logprobs"] = {"content": logprobs, "refusal": None}
        if alight is not None:
            extra["alight"] = alight
            extra["prompt_token_ids"] = generation.prompt_token_ids
            extra["token_ids"] = generation.response_token_ids
        events = [self.event({}, generation.finish_reason, **extra)]
        if self.include_usage:
            events.append(
                sse(
                    {
                        "id": self.call_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "system_fingerprint": None,
                        "choices": [],
                        "usage": usage(generation),
                    }
                )
            )
        events.append(DONE)
        return events


def completion(
    call_id: str,
    generation: Generation,
    *,
    logprobs: int | None,
    token_texts: TokenTexts | None,
    alight: dict[str, Any] | None,
) -> dict[str, Any]:
    """A legacy text completion object (`object: text_completion`)."""
    body: dict[str, Any] = {
        "id": call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": generation.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "text": generation.text,
                "logprobs": None if logprobs is None else legacy_logprobs(generation, token_texts),
                "finish_reason": generation.finish_reason,
            }
        ],
        "usage": usage(generation),
    }
    if alight is not None:
        _add_ids(body, generation, alight)
        body["choices"][0]["prompt_token_ids"] = generation.prompt_token_ids
    return body


def legacy_logprobs(generation: Generation, token_texts: TokenTexts | None) -> dict[str, Any] | None:
    content = logprobs_content(generation, token_texts)
    if content is None:
        return None
    offsets, at = [], 0
    for item in content:
        offsets.append(at)
        at += len(item["token"])
    return {
        "tokens": [item["token"] for item in content],
        "token_logprobs": [item["logprob"] for item in content],
        "top_logprobs": [{} for _ in content],
        "text_offset": offsets,
    }


def completion_chunk(call_id: str, model: str, text: str, finish_reason: str | None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    chunk = {
        "id": call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return sse(chunk)


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def completion_events(call_id: str, generation: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    """A finished completion as a stream: the text, the finish reason, the usage if asked."""
    yield completion_chunk(call_id, generation.model, generation.text, None)
    yield completion_chunk(call_id, generation.model, "", generation.finish_reason)
    if include_usage:
        counts = usage(generation)
        yield sse(
            {"id": call_id, "object": "text_completion", "model": generation.model, "choices": [], "usage": counts}
        )
    yield DONE


def model_card(name: str) -> dict[str, Any]:
    """A model as OpenAI's and Anthropic's clients both read it."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "alight",
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
    }
