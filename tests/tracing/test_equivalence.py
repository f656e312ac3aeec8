"""The light and OpenTelemetry tracers write the same span records for the same agent run."""

from __future__ import annotations

from typing import Any

import pytest

import alight.agent
from alight import semconv
from alight.agent import LLM, LitAgent
from alight.store import MemoryStore
from alight.tracing import agent_scope, emit_exception, emit_reward, emit_tool, make_tracer
from alight.types import Span
from tests.fixtures import sample_agents
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.tracing.conftest import new_claim

_VARIES = {semconv.LLM_LATENCY_S, semconv.EXCEPTION_STACKTRACE}


@alight.agent.rollout
def busy_agent(task: Any, llm: LLM) -> float:
    """Every span producer at once: openai calls, nested agent scopes, emitted tools, rewards, errors."""
    sample_agents.calculator.fn(task, llm)
    with agent_scope("checker"):
        emit_tool("sql", {"query": "select 1"}, [[1]], sql="select 1", exit_status=0)
        with agent_scope("inner"):
            emit_reward(0.5, name="partial")
        try:
            raise ValueError("bad\nanswer")
        except ValueError as err:
            emit_exception(err)
    emit_tool("broken", "x", "boom", error=True)
    return 1.0


def normalise(spans: list[Span]) -> list[tuple[Any, ...]]:
    """Spans without ids and times: parents as positions, attributes minus measured values."""
    position = {span.span_id: index for index, span in enumerate(spans)}
    return [
        (
            span.sequence_id,
            span.name,
            span.kind,
            {key: value for key, value in span.attributes.items() if key not in _VARIES},
            position.get(span.parent_id or ""),
            span.status,
            span.status_message,
            span.rollout_id,
            span.attempt_id,
        )
        for span in spans
    ]


async def run(kind: str, agent: LitAgent, script: Any) -> list[Span]:
    store = MemoryStore()
    claim = await new_claim(store)
    tracer = make_tracer(kind)
    tracer.instrument()
    with ScriptedOpenAIServer(script) as server:
        llm = LLM(model="scripted", base_url=server.url)
        async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name=agent.name):
            await agent.run(claim.rollout.task.input, {"llm": llm}, claim.rollout)
    spans = await store.query_spans(claim.rollout.rollout_id)
    # Same ids in both runs, so that rollout/attempt ids compare too.
    return [span.model_copy(update={"rollout_id": "r", "attempt_id": "a"}) for span in spans]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("agent", "script"),
    [(busy_agent, sample_agents.calculator_script), (sample_agents.langgraph_agent, sample_agents.langgraph_script)],
    ids=["openai+emit", "langgraph"],
)
async def test_light_and_otel_tracers_write_the_same_spans(agent: LitAgent, script: Any) -> None:
    light = await run("light", agent, script)
    otel = await run("otel", agent, script)
    assert len(light) > 5
    assert normalise(light) == normalise(otel)
    for spans in (light, otel):
        assert all(len(span.span_id) == 16 and len(span.trace_id) == 32 for span in spans)
        assert all(span.end_time is not None and span.end_time >= span.start_time for span in spans)
