"""Issue 4's acceptance test: real agents (plain openai with a tool, a two-node LangGraph graph, an
OpenAI Agents SDK agent) run by the runner pool against a local OpenAI-compatible server through
alight's proxy; the store holds spans naming the right agents, tools and rewards.

The agents' code (tests/fixtures/sample_agents.py) has no alight call besides the decorator and
the base URL it is handed.
"""

from __future__ import annotations

import asyncio

import pytest

from alight import semconv
from alight.runner import RunnerPool
from alight.store.client import StoreClient
from alight.types import Rollout, RolloutStatus, Span, SpanKind, Task
from tests.integration.conftest import Loop

pytestmark = pytest.mark.slow


async def _run_rollouts(store_url: str, n: int) -> list[tuple[Rollout, list[Span]]]:
    async with StoreClient(store_url) as store:
        rollouts = [Rollout(task=Task(input={"question": "What is 1 + 2?"}), timeout_s=60) for _ in range(n)]
        ids = [r.rollout_id for r in await store.enqueue(rollouts)]
        ended = await store.wait_for_rollouts(ids, timeout=120)
        assert len(ended) == n, "rollouts did not end in time"
        return [(await store.get_rollout(i), await store.query_spans(i)) for i in ids]


def _run(loop: Loop, agent: str, n: int = 2) -> list[tuple[Rollout, list[Span]]]:
    with RunnerPool(f"tests.fixtures.sample_agents:{agent}", loop.store_url, n_runners=2):
        return asyncio.run(_run_rollouts(loop.store_url, n))


def _llm_agents(spans: list[Span]) -> list[str | None]:
    return [s.attributes.get(semconv.AGENT_NAME) for s in spans if s.kind == SpanKind.LLM]


def _check_common(rollout: Rollout, spans: list[Span]) -> None:
    assert rollout.status == RolloutStatus.SUCCEEDED, rollout
    assert rollout.reward == 1.0
    llm = [s for s in spans if s.kind == SpanKind.LLM]
    assert llm and all(s.attributes[semconv.LLM_SOURCE] == "proxy" for s in llm)  # one span per call, by the proxy
    tools = [s for s in spans if s.kind == SpanKind.TOOL]
    assert [t.name for t in tools] == ["add"]
    assert tools[0].attributes[semconv.TOOL_OUTPUT] in ("3", 3)
    rewards = [s for s in spans if s.kind == SpanKind.REWARD]
    assert [r.attributes[semconv.REWARD_VALUE] for r in rewards] == [1.0]
    # Causal order: LLM call with the tool call < tool span < the LLM call that read its result < reward.
    order = [s.kind for s in spans if s.kind in (SpanKind.LLM, SpanKind.TOOL, SpanKind.REWARD)]
    assert order.index(SpanKind.TOOL) > order.index(SpanKind.LLM)
    assert order[-1] == SpanKind.REWARD
    assert SpanKind.LLM in order[order.index(SpanKind.TOOL) :]


def test_plain_openai_agent_with_a_tool(loop_servers: Loop) -> None:
    for rollout, spans in _run(loop_servers, "calculator"):
        _check_common(rollout, spans)
        assert _llm_agents(spans) == ["calculator", "calculator"]
        assert all(s.attributes.get(semconv.LLM_RESPONSE_MESSAGE) for s in spans if s.kind == SpanKind.LLM)


def test_langgraph_graph_with_two_nodes(loop_servers: Loop) -> None:
    for rollout, spans in _run(loop_servers, "langgraph_agent"):
        _check_common(rollout, spans)
        assert _llm_agents(spans) == ["researcher", "researcher", "writer"]
        tool = next(s for s in spans if s.kind == SpanKind.TOOL)
        assert tool.attributes.get(semconv.AGENT_NAME) == "researcher"


def test_openai_agents_sdk_agent(loop_servers: Loop) -> None:
    for rollout, spans in _run(loop_servers, "sdk_agent"):
        _check_common(rollout, spans)
        assert set(_llm_agents(spans)) == {"solver"}
        tool = next(s for s in spans if s.kind == SpanKind.TOOL)
        assert tool.attributes.get(semconv.AGENT_NAME) == "solver"
