"""AutoGen AgentChat agents traced with no alight call in their code (alight.tracing.autogen), against
the scripted OpenAI server (standing in for a model) and a real store server, under both tracers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import alight.agent
from alight import semconv
from alight.agent import LLM
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.tracing import Tracer
from alight.types import SpanKind, SpanStatus
from tests.fixtures import sample_agents
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call
from tests.tracing.test_instrumented_agents import check_tool_span, outline, run_traced

pytest.importorskip("autogen_agentchat")


@pytest.fixture(scope="module")
def store_server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        yield server


@pytest.fixture
async def store(store_server: StoreServer) -> AsyncIterator[StoreClient]:
    client = StoreClient(store_server.url)
    yield client
    await client.close()


def _client(llm: LLM) -> Any:
    from autogen_core.models import ModelFamily, ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = ModelInfo(
        vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
    )
    return OpenAIChatCompletionClient(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info)


@alight.agent.rollout
async def autogen_agent(task: dict[str, Any], llm: LLM) -> float:
    """An AssistantAgent named "solver" with a plain-function `add` tool: a tool call, then the answer."""
    from autogen_agentchat.agents import AssistantAgent

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = _client(llm)
    agent = AssistantAgent("solver", model_client=client, tools=[add], max_tool_iterations=2)
    result = await agent.run(task=task["question"])
    await client.close()
    return 1.0 if "3" in str(result.messages[-1].content) else 0.0


@alight.agent.rollout
async def failing_tool_agent(task: dict[str, Any], llm: LLM) -> float:
    """The tool raises: AutoGen hands the model the error, the model answers."""
    from autogen_agentchat.agents import AssistantAgent

    def add(a: int, b: int) -> int:
        """Add two integers."""
        raise ValueError("adder broken")

    client = _client(llm)
    agent = AssistantAgent("solver", model_client=client, tools=[add], max_tool_iterations=2)
    await agent.run(task=task["question"])
    await client.close()
    return 0.0


@alight.agent.rollout
async def autogen_team(task: dict[str, Any], llm: LLM) -> float:
    """A two-agent round-robin team: the solver (with `add`) then the checker (no tools)."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.teams import RoundRobinGroupChat

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = _client(llm)
    solver = AssistantAgent("solver", model_client=client, tools=[add], max_tool_iterations=2)
    checker = AssistantAgent("checker", model_client=client, system_message="Check the answer.")
    result = await RoundRobinGroupChat([solver, checker], max_turns=2).run(task=task["question"])
    await client.close()
    return 1.0 if "3" in str(result.messages[-1].content) else 0.0


@pytest.mark.anyio
async def test_assistant_agent_and_its_tool_are_named(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script, model=None) as server:
        reward, spans = await run_traced(tracer, store, autogen_agent, server=server)
    top = "autogen_agent"
    assert reward == 1.0
    assert outline(spans) == [
        ("agent", top, top, None),
        ("agent", "solver", "solver", top),
        ("llm", "llm.chat", "solver", "solver"),
        ("tool", "add", "solver", "solver"),  # by the run_json hook, not inferred a second time
        ("llm", "llm.chat", "solver", "solver"),
        ("reward", "reward", top, top),  # after the run, the rollout's own agent again
    ]
    check_tool_span(spans[3], "solver")
    assert spans[1].status is SpanStatus.OK and spans[1].end_time is not None


@pytest.mark.anyio
async def test_through_the_proxy_the_headers_name_the_agent(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script, model=None) as server:
        _, spans = await run_traced(tracer, store, autogen_agent, base_url="proxy", server=server)
    solver = next(span for span in spans if span.kind is SpanKind.AGENT and span.name == "solver")
    sent = [(r.headers[semconv.HEADER_AGENT_NAME], r.headers[semconv.HEADER_PARENT_SPAN_ID]) for r in server.requests]
    assert sent == [("solver", solver.span_id), ("solver", solver.span_id)]
    assert [span.kind for span in spans] == [SpanKind.AGENT, SpanKind.AGENT, SpanKind.TOOL, SpanKind.REWARD]


@pytest.mark.anyio
async def test_a_failing_tool_is_an_error_span(tracer: Tracer, store: StoreClient) -> None:
    script = [tool_call("add", {"a": 1, "b": 2}, sample_agents.ADD_CALL_ID), answer("no idea")]
    with ScriptedOpenAIServer(script, model=None) as server:
        _, spans = await run_traced(tracer, store, failing_tool_agent, server=server)
    (tool,) = [span for span in spans if span.kind is SpanKind.TOOL]
    assert tool.name == "add" and tool.status is SpanStatus.ERROR
    assert tool.attributes[semconv.TOOL_ERROR] is True
    assert tool.attributes[semconv.TOOL_CALL_ID] == sample_agents.ADD_CALL_ID
    assert "adder broken" in str(tool.attributes[semconv.TOOL_OUTPUT])
    # the model read AutoGen's error text for the call
    assert "adder broken" in server.requests[1].body["messages"][-1]["content"]


@pytest.mark.anyio
async def test_team_members_are_agents_of_their_own(tracer: Tracer, store: StoreClient) -> None:
    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][0].get("content") == "Check the answer.":
            return answer("Checked: 3")
        return sample_agents.calculator_script(request)

    with ScriptedOpenAIServer(script, model=None) as server:
        reward, spans = await run_traced(tracer, store, autogen_team, server=server)
    assert reward == 1.0
    llm_agents = [span.attributes[semconv.AGENT_NAME] for span in spans if span.kind is SpanKind.LLM]
    assert llm_agents == ["solver", "solver", "checker"]
    (tool,) = [span for span in spans if span.kind is SpanKind.TOOL]
    assert tool.attributes[semconv.AGENT_NAME] == "solver"


LAZY = textwrap.dedent(
    """
    import sys
    from alight.tracing import make_tracer

    if sys.argv[1] == "before":
        import autogen_agentchat.agents  # bound AutoGen's own helper by name before alight instruments
    make_tracer("light").instrument()
    print("autogen_core" in sys.modules)
    import autogen_core
    from autogen_agentchat.agents import _base_chat_agent
    from autogen_agentchat.teams._group_chat import _chat_agent_container
    from autogen_core.tools import BaseTool

    helper = autogen_core.trace_invoke_agent_span
    print(hasattr(helper, "__wrapped__"), _base_chat_agent.trace_invoke_agent_span is helper,
          _chat_agent_container.trace_invoke_agent_span is helper, hasattr(BaseTool.run_json, "__wrapped__"))
    """
)


@pytest.mark.parametrize("imported", ["after", "before"])
def test_autogen_is_hooked_whether_imported_before_or_after_instrument(imported: str) -> None:
    done = subprocess.run([sys.executable, "-c", LAZY, imported], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported_at_instrument, hooked = done.stdout.split("\n")[:2]
    assert imported_at_instrument == str(imported == "before")
    assert hooked == "True True True True"
