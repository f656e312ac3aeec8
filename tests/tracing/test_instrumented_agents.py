"""Real agents (plain openai, LangGraph, OpenAI Agents SDK) traced with no alight call in their
code, against the scripted OpenAI server and a real store server, under both tracers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import alight.agent
from alight import semconv
from alight.agent import LLM, LitAgent
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.tracing import Tracer, emit_reward
from alight.types import Span, SpanKind, SpanStatus
from tests.fixtures import sample_agents
from tests.fixtures.openai_server import ScriptedOpenAIServer, with_crashes
from tests.tracing.conftest import new_claim


@pytest.fixture(scope="module")
def store_server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        yield server


@pytest.fixture
async def store(store_server: StoreServer) -> AsyncIterator[StoreClient]:
    client = StoreClient(store_server.url)
    yield client
    await client.close()


async def run_traced(
    tracer: Tracer, store: Any, agent: LitAgent, base_url: str | None = None, server: ScriptedOpenAIServer | None = None
) -> tuple[float | None, list[Span]]:
    """Run `agent` in an attempt the way the runner does, and return its reward and spans."""
    claim = await new_claim(store)
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    assert server is not None
    llm = LLM(model="scripted", base_url=base_url or server.url)
    if base_url == "proxy":
        llm = LLM(model="scripted", base_url=server.proxy_url(rollout_id, attempt_id))
    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name=agent.name):
        reward = await agent.run(claim.rollout.task.input, {"llm": llm}, claim.rollout, claim.attempt)
        if reward is not None:
            emit_reward(reward, name="final")
    return reward, await store.query_spans(rollout_id, attempt_id)


def outline(spans: list[Span]) -> list[tuple[str, str, str, str | None]]:
    """(kind, name, agent, parent's name) per span, in order."""
    names = {span.span_id: span.name for span in spans}
    return [
        (span.kind.value, span.name, span.attributes[semconv.AGENT_NAME], names.get(span.parent_id or ""))
        for span in spans
    ]


def check_tool_span(span: Span, agent: str) -> None:
    assert span.kind is SpanKind.TOOL and span.name == "add" and span.status is SpanStatus.OK
    assert span.attributes[semconv.TOOL_NAME] == "add"
    assert span.attributes[semconv.TOOL_CALL_ID] == sample_agents.ADD_CALL_ID
    assert span.attributes[semconv.TOOL_ERROR] is False
    assert str(span.attributes[semconv.TOOL_OUTPUT]) == "3"
    arguments = span.attributes[semconv.TOOL_ARGUMENTS]
    assert arguments in ({"a": 1, "b": 2}, '{"a": 1, "b": 2}')
    assert span.attributes[semconv.AGENT_NAME] == agent


def check_llm_span(span: Span, *, stream: bool) -> None:
    attrs = span.attributes
    assert attrs[semconv.LLM_SOURCE] == "client" and attrs[semconv.LLM_TOKEN_IDS_SOURCE] == "none"
    assert attrs[semconv.LLM_STREAM] is stream
    assert attrs[semconv.LLM_REQUEST_MODEL] == "scripted"
    assert attrs[semconv.LLM_REQUEST_MESSAGES][0]["role"] in ("user", "system")
    assert attrs[semconv.LLM_RESPONSE_MESSAGE]["role"] == "assistant"
    assert attrs[semconv.LLM_LATENCY_S] > 0


@pytest.mark.anyio
@pytest.mark.parametrize("agent", [sample_agents.calculator, sample_agents.async_calculator], ids=["sync", "async"])
async def test_plain_openai_agent(tracer: Tracer, store: StoreClient, agent: LitAgent) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script) as server:
        reward, spans = await run_traced(tracer, store, agent, server=server)
    name = agent.name
    assert reward == 1.0
    assert outline(spans) == [
        ("agent", name, name, None),
        ("llm", "llm.chat", name, name),
        ("tool", "add", name, name),  # inferred from the tool message answering the call
        ("llm", "llm.chat", name, name),
        ("reward", "reward", name, name),
    ]
    assert [span.sequence_id for span in spans] == [1, 2, 3, 4, 5]
    first, second = spans[1], spans[3]
    check_llm_span(first, stream=agent is sample_agents.async_calculator)
    check_llm_span(second, stream=agent is sample_agents.calculator)
    call = first.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]
    assert call["id"] == sample_agents.ADD_CALL_ID and call["function"]["name"] == "add"
    assert first.attributes[semconv.LLM_FINISH_REASON] == "tool_calls"
    assert first.attributes[semconv.LLM_REQUEST_TOOLS][0]["function"]["name"] == "add"
    assert second.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"] == "The answer is 3"
    assert first.attributes[semconv.LLM_USAGE]["total_tokens"] == 15  # streamed with include_usage, or not
    check_tool_span(spans[2], name)
    assert spans[4].attributes[semconv.REWARD_VALUE] == 1.0
    assert spans[4].attributes[semconv.REWARD_NAME] == "final"
    assert len({span.trace_id for span in spans}) == 1


@pytest.mark.anyio
async def test_proxy_url_gets_headers_and_no_client_llm_span(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script) as server:
        reward, spans = await run_traced(tracer, store, sample_agents.calculator, base_url="proxy", server=server)
    assert reward == 1.0
    # The proxy writes the LLM spans; the client side keeps the agent, tool and reward spans.
    assert [(span.kind.value, span.sequence_id) for span in spans] == [("agent", 1), ("tool", 3), ("reward", 5)]
    root = spans[0]
    headers = [request.headers for request in server.requests]
    assert [h[semconv.HEADER_SEQUENCE_ID] for h in headers] == ["2", "4"]
    for h in headers:
        assert h[semconv.HEADER_AGENT_NAME] == "calculator"
        assert h[semconv.HEADER_PARENT_SPAN_ID] == root.span_id
        assert h[semconv.HEADER_TRACE_ID] == root.trace_id
    assert server.requests[0].rollout_id == root.rollout_id
    assert server.requests[0].attempt_id == root.attempt_id
    check_tool_span(spans[1], "calculator")


@pytest.mark.anyio
async def test_langgraph_nodes_are_agents(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.langgraph_script) as server:
        reward, spans = await run_traced(tracer, store, sample_agents.langgraph_agent, server=server)
    top = "langgraph_agent"
    assert reward == 1.0
    assert outline(spans) == [
        ("agent", top, top, None),
        ("agent", "researcher", "researcher", top),
        ("llm", "llm.chat", "researcher", "researcher"),
        ("tool", "add", "researcher", "researcher"),  # from the callback handler, not inferred twice
        ("llm", "llm.chat", "researcher", "researcher"),
        ("agent", "writer", "writer", top),
        ("llm", "llm.chat", "writer", "writer"),  # sync node, run in a worker thread
        ("reward", "reward", top, top),  # after the graph, the agent's own frame again
    ]
    check_tool_span(spans[3], "researcher")


@pytest.mark.anyio
async def test_langgraph_through_proxy_names_nodes_in_headers(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.langgraph_script) as server:
        _, spans = await run_traced(tracer, store, sample_agents.langgraph_agent, base_url="proxy", server=server)
    by_name = {span.name: span for span in spans}
    agents = [(r.headers[semconv.HEADER_AGENT_NAME], r.headers[semconv.HEADER_PARENT_SPAN_ID]) for r in server.requests]
    assert agents == [
        ("researcher", by_name["researcher"].span_id),
        ("researcher", by_name["researcher"].span_id),
        ("writer", by_name["writer"].span_id),
    ]
    assert [r.headers[semconv.HEADER_SEQUENCE_ID] for r in server.requests] == ["3", "5", "7"]


@pytest.mark.anyio
async def test_openai_agents_sdk_agent(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script) as server:
        reward, spans = await run_traced(tracer, store, sample_agents.sdk_agent, server=server)
    top = "sdk_agent"
    assert reward == 1.0
    assert outline(spans) == [
        ("agent", top, top, None),
        ("agent", "solver", "solver", top),
        ("llm", "llm.chat", "solver", "solver"),
        ("tool", "add", "solver", "solver"),
        ("llm", "llm.chat", "solver", "solver"),
        ("reward", "reward", top, top),
    ]
    check_tool_span(spans[3], "solver")


def test_instrument_is_idempotent_and_drops_the_agents_sdk_export(tracer: Tracer) -> None:
    from agents.tracing import get_trace_provider
    from agents.tracing.processors import default_processor
    from openai.resources.chat.completions.completions import Completions

    from alight.tracing.openai_agents import AlightTraceProcessor

    patched = Completions.create
    tracer.instrument()
    assert Completions.create is patched
    assert patched.__wrapped__.__module__.startswith("openai.")  # wrapped once, around the SDK's own
    processors = get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined]
    assert default_processor() not in processors  # nothing is sent to OpenAI's servers
    assert sum(isinstance(p, AlightTraceProcessor) for p in processors) == 1


def test_outside_an_attempt_openai_calls_are_untouched(tracer: Tracer) -> None:
    import openai

    with ScriptedOpenAIServer(sample_agents.calculator_script) as server:
        client = openai.OpenAI(base_url=server.proxy_url("ro-x", "at-x"), api_key="x")
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert not any(key.startswith("x-alight") for key in server.requests[0].headers)


@alight.agent.rollout
async def failing_llm_agent(llm: LLM) -> None:
    import openai

    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
        with contextlib.suppress(openai.InternalServerError):
            await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
        stream = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "again"}], stream=True
        )
        async for _ in stream:
            break  # the agent drops the stream early: the span still ends
        await stream.close()


@pytest.mark.anyio
async def test_failed_and_abandoned_llm_calls_are_recorded(tracer: Tracer, store: StoreClient) -> None:
    script = with_crashes(None, sample_agents.answer("a long answer"))

    with ScriptedOpenAIServer(script) as server:
        _, spans = await run_traced(tracer, store, failing_llm_agent, server=server)
    _, failed, dropped = spans
    assert failed.status is SpanStatus.ERROR and "InternalServerError" in (failed.status_message or "")
    assert dropped.status is SpanStatus.OK and dropped.attributes[semconv.LLM_STREAM] is True
    assert dropped.end_time is not None
