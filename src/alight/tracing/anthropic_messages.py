"""Anthropic Messages data in the chat shape LLM spans record (what the proxy records too): a
request's system prompt, messages, sampling and tools as chat attributes, and an answer, from a
message or from its stream events, as an OpenAI assistant message with its tool calls."""

from __future__ import annotations

import json
from typing import Any

from alight import semconv


class Answer:
    """An answer's content blocks, stop reason, model and usage, from a message or its stream events."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.inputs: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] = {}

    @classmethod
    def of_message(cls, message: dict[str, Any]) -> Answer:
        answer = cls()
        answer.blocks = dict(enumerate(message.get("content") or []))
        answer.stop_reason = message.get("stop_reason")
        answer.model = message.get("model")
        answer.usage = dict(message.get("usage") or {})
        return answer

    def add(self, event: dict[str, Any]) -> None:
        kind, index = event.get("type"), event.get("index", 0)
        if kind == "message_start":
            message = event.get("message") or {}
            self.model = message.get("model")
            self.usage.update({k: v for k, v in (message.get("usage") or {}).items() if v is not None})
        elif kind == "content_block_start":
            self.blocks[index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            block = self.blocks.setdefault(index, {"type": "text", "text": ""})
            if delta.get("type") == "text_delta":
                block["text"] = (block.get("text") or "") + (delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                self.partial_json.setdefault(index, []).append(delta.get("partial_json") or "")
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})

    def message(self) -> dict[str, Any] | None:
        """The answer as an OpenAI assistant message (None when nothing was answered)."""
        if not self.blocks:
            return None
        texts, calls = [], []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "text":
                texts.append(block.get("text") or "")
            elif block.get("type") == "tool_use":
                given = block.get("input")
                if index in self.partial_json:
                    text = "".join(self.partial_json[index])
                    try:
                        given = json.loads(text) if text else {}
                    except ValueError:
                        given = text
                self.inputs[block.get("id") or ""] = given
                calls.append(tool_call(block.get("id") or "", block.get("name") or "", given))
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
        return message


def tool_call(call_id: str, name: str, given: Any) -> dict[str, Any]:
    arguments = given if isinstance(given, str) else json.dumps(given, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content or () if isinstance(part, dict))


def chat_messages(system: Any, messages: list[Any]) -> list[dict[str, Any]]:
    """Anthropic's system prompt and messages as OpenAI chat messages (what the proxy records too):
    tool_use blocks as tool calls, tool_result blocks as `tool` messages; other blocks left out."""
    chat: list[dict[str, Any]] = []
    if system:
        chat.append({"role": "system", "content": text_of(system)})
    for message in messages:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
            continue
        blocks = [block for block in content or () if isinstance(block, dict)]
        if role == "assistant":
            calls = [
                tool_call(b.get("id") or "", b.get("name") or "", b.get("input"))
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
            out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                out["tool_calls"] = calls
            chat.append(out)
            continue
        texts: list[str] = []
        for block in blocks:
            if block.get("type") == "tool_result":
                if texts:
                    chat.append({"role": "user", "content": "".join(texts)})
                    texts = []
                result = {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": text_of(block.get("content")),
                }
                chat.append(result)
            elif block.get("type") == "text":
                texts.append(block.get("text") or "")
        if texts or not blocks:
            chat.append({"role": "user", "content": "".join(texts)})
    return chat


def request_attributes(body: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        semconv.LLM_SOURCE: "client",
        semconv.LLM_API: "anthropic",
        semconv.LLM_TOKEN_IDS_SOURCE: "none",
        semconv.LLM_STREAM: bool(body.get("stream")),
        semconv.LLM_REQUEST_MESSAGES: chat_messages(body.get("system"), list(body.get("messages") or [])),
    }
    if isinstance(body.get("model"), str):
        attrs[semconv.LLM_REQUEST_MODEL] = body["model"]
    sampling: dict[str, Any] = {
        key: body[key] for key in ("max_tokens", "temperature", "top_p", "top_k") if key in body
    }
    if body.get("stop_sequences"):
        sampling["stop"] = body["stop_sequences"]
    if sampling:
        attrs[semconv.LLM_REQUEST_SAMPLING] = sampling
    tools = [tool for tool in body.get("tools") or () if isinstance(tool, dict) and "input_schema" in tool]
    if tools:
        attrs[semconv.LLM_REQUEST_TOOLS] = [
            {
                "type": "function",
                "function": {
                    "name": tool.get("name"),
                    "description": tool.get("description"),
                    "parameters": tool["input_schema"],
                },
            }
            for tool in tools
        ]
    return attrs
