"""Hermes tool-call parsing, streaming hold-back and tool-definition checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alight.engines.toolcalls import ToolCallStreamFilter, parse_tool_calls, validate_tools
from alight.errors import InvalidRequestError

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_a_lone_call_has_no_content() -> None:
    content, calls = parse_tool_calls(CALL)
    assert content is None
    assert len(calls) == 1
    assert calls[0]["type"] == "function"
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) > 10
    assert calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}


def test_text_around_several_calls_is_the_content() -> None:
    second = '<tool_call>{"name": "mul", "arguments": "{\\"x\\": 1}"}</tool_call>'
    content, calls = parse_tool_calls(f"Let me add.\n{CALL}\n{second}\nDone.")
    assert content == "Let me add.\n\n\nDone."
    assert [c["function"]["name"] for c in calls] == ["add", "mul"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": 1}
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}',  # never closed
    ],
)
def test_malformed_blocks_stay_content(block: str) -> None:
    content, calls = parse_tool_calls(f"Hi {block}")
    assert calls == []
    assert content == f"Hi {block}"


def test_parameters_key_and_missing_arguments_are_accepted() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"q": "x"}}</tool_call>')
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "x"}
    _, calls = parse_tool_calls('<tool_call>{"name": "g"}</tool_call>')
    assert calls[0]["function"]["arguments"] == "{}"


def stream(text: str, cuts: list[int]) -> str:
    shown = ToolCallStreamFilter()
    pieces = [shown.feed(text[:cut]) for cut in sorted(cuts)]
    pieces.append(shown.feed(text, final=True))
    return "".join(pieces)


def test_stream_hides_markup_and_partial_tags() -> None:
    text = f"Sure.\n{CALL}"
    shown = ToolCallStreamFilter()
    assert shown.feed("Sure.\n<tool") == "Sure."
    assert shown.feed(f"Sure.\n{CALL[:30]}") == ""
    assert shown.feed(text, final=True) == ""
    assert stream("a <tool_call>{bad}</tool_call> b", list(range(40))) == "a <tool_call>{bad}</tool_call> b"


pieces = st.sampled_from(["Hi", " ", "\n", "<tool", "_call>", "<tool_call>", "</tool_call>", CALL, "{", "x", "<"])


@given(st.lists(pieces, max_size=12), st.lists(st.integers(0, 200), max_size=20))
@settings(max_examples=300, deadline=None)
def test_streamed_content_is_exactly_the_final_content(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    assert stream(text, [min(c, len(text)) for c in cuts]) == (parse_tool_calls(text)[0] or "")


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("add", "must be a list"),
        ([{"type": "retrieval"}], '"type": "function"'),
        ([{"type": "function"}], 'no "function" object'),
        ([{"type": "function", "function": {"name": ""}}], "name must be a non-empty string"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "JSON schema object"),
    ],
)
def test_bad_tool_definitions(tools: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        validate_tools(tools)


def test_good_tool_definitions() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}, {"function": {"name": "g", "parameters": {}}}]
    assert validate_tools(tools) == tools
    assert validate_tools([]) is None
    assert validate_tools(None) is None
