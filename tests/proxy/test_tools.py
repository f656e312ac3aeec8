"""Tool calls through the proxy with the stock `openai` client, streamed and not, and their spans.

The engine is `ScriptedEngine` (tests/proxy/scripted.py): the untrained tiny model cannot be
relied on to call a tool."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.fixtures.tools import ADD_TOOLS
from tests.proxy.conftest import new_attempt, spans_of
from tests.proxy.scripted import TEXT, ScriptedEngine

TOOLS = ADD_TOOLS
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ProxyServer]:
    engine = ScriptedEngine(tool_arguments={"add": {"a": 2, "b": 3}})
    with ProxyServer(Proxy(engine, MemoryStore())) as server:
        yield server


def test_tool_call_then_tool_result(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    llm = openai.OpenAI(base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0)
    first = llm.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS)  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "add" and call.id
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}

    history = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = llm.chat.completions.create(model="scripted", messages=history, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == TEXT and second.choices[0].finish_reason == "stop"

    one, two = spans_of(scripted, rid)
    assert one.attributes[semconv.LLM_REQUEST_TOOLS] == TOOLS
    assert one.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"] == [call.model_dump()]
    assert one.attributes[semconv.LLM_FINISH_REASON] == "tool_calls"
    assert two.attributes[semconv.LLM_REQUEST_MESSAGES][1]["tool_calls"][0]["function"]["name"] == "add"
    assert two.attributes[semconv.LLM_REQUEST_MESSAGES][2] == {"role": "tool", "tool_call_id": call.id, "content": "5"}


def test_streamed_tool_calls_arrive_as_openai_sends_them(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    llm = openai.OpenAI(base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0)
    whole = llm.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS, tool_choice="required")  # type: ignore[arg-type]
    chunks = list(llm.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS, stream=True))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    head, args = deltas[0][0], deltas[1][0]
    assert (
        head.index == 0 and head.id and head.function and head.function.name == "add" and head.function.arguments == ""
    )
    assert args.id is None and args.function and json.loads(args.function.arguments or "") == {"a": 2, "b": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # the SDK's own stream accumulator rebuilds the same message
    with llm.chat.completions.stream(model="scripted", messages=QUESTION, tools=TOOLS) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert (
        call.function.name == "add"
        and call.function.arguments == (whole.choices[0].message.tool_calls or [])[0].function.arguments
    )

    unstreamed, streamed, _ = spans_of(scripted, rid)
    ignore = {semconv.LLM_STREAM, semconv.LLM_LATENCY_S, semconv.LLM_REQUEST_SAMPLING}
    strip = lambda a: {k: v for k, v in a.items() if k not in ignore}  # noqa: E731
    streamed_message = streamed.attributes[semconv.LLM_RESPONSE_MESSAGE]
    unstreamed_message = unstreamed.attributes[semconv.LLM_RESPONSE_MESSAGE]
    assert streamed_message["tool_calls"][0]["function"] == unstreamed_message["tool_calls"][0]["function"]
    assert strip(streamed.attributes).keys() == strip(unstreamed.attributes).keys()


def test_tool_choice_must_name_an_offered_tool(scripted: ProxyServer) -> None:
    llm = openai.OpenAI(base_url=scripted.base_url(), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="unknown function"):
        llm.chat.completions.create(
            model="scripted", messages=QUESTION, tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "mul"}},
        )  # fmt: skip
