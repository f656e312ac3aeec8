"""Hermes-style tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the model's text.

Used by every engine that sees the raw generated text (embedded, vLLM): `parse_tool_calls` turns the
text into an OpenAI assistant message, `ToolCallStreamFilter` decides which streamed text is safe
to show as content, and `validate_tools` checks the request's tool definitions. Streamed content
always concatenates to exactly the final message's content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from alight.errors import InvalidRequestError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass
class _Segment:
    text: str  # raw text of the segment (a whole block, markup included, for calls)
    call: dict[str, Any] | None = None  # the parsed OpenAI tool call when the segment is a valid block
    closed: bool = True  # False: a block whose closing tag has not been generated (yet)


def _parse_call(body: str) -> dict[str, Any] | None:
    """The OpenAI tool call in the JSON between the tags, or None when it is not a valid call."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": data["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _segments(text: str) -> list[_Segment]:
    """Split text into plain text and tool-call blocks (the last block may be unclosed)."""
    out: list[_Segment] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            out.append(_Segment(text[pos:]))
            return out
        out.append(_Segment(text[pos:start]))
        end = text.find(TOOL_CALL_CLOSE, start + len(TOOL_CALL_OPEN))
        if end < 0:
            out.append(_Segment(text[start:], closed=False))
            return out
        block_end = end + len(TOOL_CALL_CLOSE)
        call = _parse_call(text[start + len(TOOL_CALL_OPEN) : end].strip())
        out.append(_Segment(text[start:block_end], call=call))
        pos = block_end


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split generated text into (content, tool_calls) in OpenAI form.

    Every well-formed `<tool_call>{"name": str, "arguments": object}</tool_call>` block becomes a
    tool call `{"id": "call_<hex>", "type": "function", "function": {"name", "arguments": JSON
    string}}`. Content is the text outside those blocks, whitespace-stripped, None when empty; a
    block whose JSON is malformed (or that is never closed) stays in the content as written."""
    calls: list[dict[str, Any]] = []
    outside: list[str] = []
    for segment in _segments(text):
        if segment.call is not None:
            calls.append(segment.call)
        else:
            outside.append(segment.text)
    content = "".join(outside).strip()
    return (content or None), calls


def assistant_message(text: str, *, parse_tools: bool = True) -> dict[str, Any]:
    """The OpenAI assistant message for generated text (tool calls parsed out when asked)."""
    if not parse_tools:
        return {"role": "assistant", "content": text}
    content, calls = parse_tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def _partial_open_tag_len(text: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of `<tool_call>`."""
    for size in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-size:]):
            return size
    return 0


def committed_content(text: str, *, final: bool) -> str:
    """The part of the final content that `text` (a prefix of the generated text) already settles.

    Text that could still become tool-call markup (an open block, a partial `<tool_call>` tag) and
    trailing whitespace (stripped if nothing follows) is held back. With final=True it is the
    content of `parse_tool_calls(text)` ("" for None)."""
    if final:
        return parse_tool_calls(text)[0] or ""
    segments = _segments(text)
    last = segments[-1]
    if last.closed:  # the text ends in plain text, whose end may be the start of an opening tag
        last = _Segment(last.text[: len(last.text) - _partial_open_tag_len(last.text)])
    kept = [*segments[:-1], last]
    joined = "".join(s.text for s in kept if s.closed and s.call is None)
    return joined.strip()


class ToolCallStreamFilter:
    """Turns the growing generated text into content deltas that never show tool-call markup."""

    def __init__(self) -> None:
        self._sent = ""

    def feed(self, text: str, *, final: bool = False) -> str:
        """Give the whole text generated so far; returns the new content to stream (maybe "")."""
        committed = committed_content(text, final=final)
        if not committed.startswith(self._sent):  # cannot happen: committed content only grows
            return ""
        delta = committed[len(self._sent) :]
        self._sent = committed
        return delta


class PlainTextStream:
    """The stream filter for answers without tool-call parsing: all text is content."""

    def __init__(self) -> None:
        self._sent = ""

    def feed(self, text: str, *, final: bool = False) -> str:
        """Give the whole text generated so far; returns the new content to stream (maybe "")."""
        if not text.startswith(self._sent):
            return ""
        delta, self._sent = text[len(self._sent) :], text
        return delta


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check OpenAI tool definitions; returns them (None for no tools).

    Raises:
        InvalidRequestError: not a list of {"type": "function", "function": {"name": str,
            "parameters": object (optional)}}.
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError("tools must be a list of tool definitions")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise InvalidRequestError(f'tools[{i}] must be an object with "type": "function"')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequestError(f'tools[{i}] has no "function" object')
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tools[{i}].function.name must be a non-empty string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools or None
