"""Agent frameworks through the proxy, unchanged: LangChain's ChatOpenAI (tools, streaming,
structured output) and an OpenAI Agents SDK agent on OpenAIChatCompletionsModel.

The engine is `ScriptedEngine` (tests/proxy/scripted.py), since the untrained tiny model cannot
call tools or follow a JSON schema; the tiny model itself runs through LangChain in the first test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of
from tests.proxy.scripted import TEXT, ScriptedEngine


class Sum(BaseModel):
    a: int
    b: int
    total: int


@pytest.fixture(scope="module")
def scripted() -> Iterator[ProxyServer]:
    engine = ScriptedEngine(
        tool_arguments={"add": {"a": 2, "b": 3}, "Sum": {"a": 2, "b": 3, "total": 5}},
        json_answer={"a": 2, "b": 3, "total": 5},
    )
    with ProxyServer(Proxy(engine, MemoryStore())) as server:
        yield server


def test_langchain_chat_openai_on_the_tiny_model(served: ProxyServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    rid, aid = new_attempt(served)
    llm = langchain_openai.ChatOpenAI(
        model="tiny", base_url=served.base_url(rid, aid), api_key="x", max_tokens=5, temperature=0, max_retries=0
    )
    answer = llm.invoke("Hello")
    streamed = "".join(str(chunk.content) for chunk in llm.stream("Hello"))
    assert streamed == answer.content
    spans = spans_of(served, rid)
    assert [s.attributes[semconv.LLM_STREAM] for s in spans] == [False, True]
    assert spans[0].attributes[semconv.LLM_RESPONSE_TOKEN_IDS] == spans[1].attributes[semconv.LLM_RESPONSE_TOKEN_IDS]


def test_langchain_tools_and_structured_output(scripted: ProxyServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    rid, aid = new_attempt(scripted)
    llm = langchain_openai.ChatOpenAI(
        model="scripted", base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0
    )
    called = llm.bind_tools([add]).invoke("What is 2+3?")
    assert called.tool_calls == [{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_1", "type": "tool_call"}]
    chunks = list(llm.bind_tools([add]).stream("What is 2+3?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.tool_calls[0]["args"] == {"a": 2, "b": 3}  # type: ignore[attr-defined]

    assert llm.with_structured_output(Sum).invoke("2+3?") == Sum(a=2, b=3, total=5)  # json_schema
    by_tool = llm.with_structured_output(Sum, method="function_calling").invoke("2+3?")
    assert by_tool == Sum(a=2, b=3, total=5)
    spans = spans_of(scripted, rid)
    assert len(spans) == 4
    assert spans[2].attributes[semconv.LLM_REQUEST_SAMPLING]["response_format"]["type"] == "json_schema"
    assert spans[3].attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]["function"]["name"] == "Sum"


@pytest.mark.anyio
async def test_openai_agents_sdk_agent_with_a_tool(scripted: ProxyServer) -> None:
    agents = pytest.importorskip("agents")

    agents.set_tracing_disabled(True)  # no trace export (there is no network); restored below
    try:
        await _run_sdk_agent(agents, scripted)
    finally:
        agents.set_tracing_disabled(False)


async def _run_sdk_agent(agents: Any, scripted: ProxyServer) -> None:
    import openai

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    rid, aid = new_attempt(scripted)
    async with openai.AsyncOpenAI(base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0) as client:
        model = agents.OpenAIChatCompletionsModel(model="scripted", openai_client=client)
        agent = agents.Agent(name="calculator", instructions="Use the tool.", tools=[add], model=model)
        result = await agents.Runner.run(agent, "What is 2+3?")
        assert result.final_output == TEXT
        streamed = agents.Runner.run_streamed(agent, "What is 2+3?")
        async for _ in streamed.stream_events():
            pass
        assert streamed.final_output == TEXT
    spans = spans_of(scripted, rid)
    assert [s.attributes[semconv.LLM_STREAM] for s in spans] == [False, False, True, True]
    tool_result = spans[1].attributes[semconv.LLM_REQUEST_MESSAGES][-1]
    assert tool_result["role"] == "tool" and tool_result["content"] == "5"
    assert spans[0].attributes[semconv.LLM_REQUEST_MESSAGES][0] == {"role": "system", "content": "Use the tool."}
