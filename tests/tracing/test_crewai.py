"""CrewAI crews and agents traced with no alight call in their code (alight.tracing.crewai), against the
scripted OpenAI server (standing in for a model) and a real store server, under both tracers.
CrewAI has its own extra and environment (`pytest -m crewai` there); without it these tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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

pytest.importorskip("crewai", reason='CrewAI is not installed (pip install "alight[crewai]")')
pytestmark = pytest.mark.crewai
ROLE = "Adder"


@pytest.fixture(autouse=True)
def crewai_data_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CrewAI keeps each kickoff's task outputs under the user's data folder: a temporary one here."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


@pytest.fixture(scope="module")
def store_server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        yield server


@pytest.fixture
async def store(store_server: StoreServer) -> AsyncIterator[StoreClient]:
    client = StoreClient(store_server.url)
    yield client
    await client.close()


def adder(llm: LLM, *, broken: bool = False) -> Any:
    from crewai import LLM as CrewLLM
    from crewai import Agent
    from crewai.tools import tool

    @tool("add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        if broken:
            raise RuntimeError("adder broken")
        return a + b

    model = CrewLLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
    return Agent(role=ROLE, goal="add", backstory="", llm=model, tools=[add], max_iter=2, verbose=False)


@alight.agent.rollout
def crew_agent(task: dict[str, Any], llm: LLM) -> float:
    from crewai import Crew, Task

    agent = adder(llm)
    crew = Crew(agents=[agent], tasks=[Task(description="1+2?", expected_output="a number", agent=agent)])
    return 1.0 if "3" in crew.kickoff().raw else 0.0


@alight.agent.rollout
def standalone_broken_agent(task: dict[str, Any], llm: LLM) -> float:
    adder(llm, broken=True).kickoff("1+2?")  # an Agent without a crew
    return 0.0


@pytest.mark.anyio
async def test_a_crew_agent_and_its_tool_are_named(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script, model=None) as server:
        reward, spans = await run_traced(tracer, store, crew_agent, server=server)
    top = "crew_agent"
    assert reward == 1.0
    assert outline(spans) == [
        ("agent", top, top, None),
        ("agent", ROLE, ROLE, top),  # the crew's Agent, by its role
        ("llm", "llm.chat", ROLE, ROLE),
        ("tool", "add", ROLE, ROLE),  # by the tool hooks, not inferred a second time
        ("llm", "llm.chat", ROLE, ROLE),
        ("reward", "reward", top, top),
    ]
    check_tool_span(spans[3], ROLE)
    assert spans[3].attributes[semconv.TOOL_ARGUMENTS] == {"a": 1, "b": 2}  # as CrewAI ran it
    assert spans[1].status is SpanStatus.OK and spans[1].end_time is not None


@pytest.mark.anyio
async def test_through_the_proxy_the_headers_name_the_agent(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script, model=None) as server:
        _, spans = await run_traced(tracer, store, crew_agent, base_url="proxy", server=server)
    role = next(span for span in spans if span.kind is SpanKind.AGENT and span.name == ROLE)
    sent = [(r.headers[semconv.HEADER_AGENT_NAME], r.headers[semconv.HEADER_PARENT_SPAN_ID]) for r in server.requests]
    assert sent == [(ROLE, role.span_id), (ROLE, role.span_id)]
    assert [span.kind for span in spans] == [SpanKind.AGENT, SpanKind.AGENT, SpanKind.TOOL, SpanKind.REWARD]


@pytest.mark.anyio
async def test_a_standalone_agent_with_a_failing_tool(tracer: Tracer, store: StoreClient) -> None:
    script = [tool_call("add", {"a": 1, "b": 2}, sample_agents.ADD_CALL_ID), answer("no idea")]
    with ScriptedOpenAIServer(script, model=None) as server:
        _, spans = await run_traced(tracer, store, standalone_broken_agent, server=server)
    assert [(kind, name) for kind, name, _, _ in outline(spans)][:4] == [
        ("agent", "standalone_broken_agent"),
        ("agent", ROLE),
        ("llm", "llm.chat"),
        ("tool", "add"),
    ]
    tool = spans[3]
    assert tool.status is SpanStatus.ERROR and tool.attributes[semconv.TOOL_ERROR] is True
    assert tool.attributes[semconv.TOOL_CALL_ID] == sample_agents.ADD_CALL_ID
    assert "adder broken" in str(tool.attributes[semconv.TOOL_OUTPUT]) and "adder broken" in str(tool.status_message)
    assert "adder broken" in server.requests[1].body["messages"][-1]["content"]  # what the model read


@alight.agent.rollout
def crew_agent_failing_once(task: dict[str, Any], llm: LLM) -> float:
    """A crew whose agent fails its first execution (its step callback raises once): CrewAI retries it."""
    from crewai import Crew, Task

    steps: list[Any] = []

    def fail_once(step: Any) -> None:
        steps.append(step)
        if len(steps) == 1:
            raise RuntimeError("the first execution fails")

    agent = adder(llm)
    agent.step_callback = fail_once
    crew = Crew(agents=[agent], tasks=[Task(description="1+2?", expected_output="a number", agent=agent)])
    return 1.0 if "3" in crew.kickoff().raw else 0.0


@pytest.mark.anyio
async def test_a_retried_agent_execution_is_a_sibling_of_the_failed_one(tracer: Tracer, store: StoreClient) -> None:
    with ScriptedOpenAIServer(sample_agents.calculator_script, model=None) as server:
        reward, spans = await run_traced(tracer, store, crew_agent_failing_once, server=server)
    assert reward == 1.0
    top = spans[0]
    executions = [span for span in spans if span.kind is SpanKind.AGENT and span.name == ROLE]
    assert len(executions) == 2
    assert [span.parent_id for span in executions] == [top.span_id, top.span_id]  # beside, not inside
    assert executions[0].status is SpanStatus.ERROR and "the first execution fails" in str(executions[0].status_message)
    assert executions[1].status is SpanStatus.OK
    assert executions[0].end_time is not None and executions[0].end_time <= executions[1].start_time
    retry_children = [span for span in spans if span.parent_id == executions[1].span_id]
    assert [span.kind for span in retry_children][-1] is SpanKind.LLM  # the retry's calls are its own


LAZY = """
import os, sys
from alight.tracing import make_tracer

make_tracer("light").instrument()  # as a runner does, before the agent's module imports crewai
print("crewai" in sys.modules)
from crewai import Agent
from crewai.hooks import get_after_tool_call_hooks, get_before_tool_call_hooks
from alight.tracing import crewai as traced

print(hasattr(Agent.execute_task, "__wrapped__"), hasattr(Agent.aexecute_task, "__wrapped__"),
      traced.before_tool_call in get_before_tool_call_hooks(), traced.after_tool_call in get_after_tool_call_hooks(),
      os.environ.get("CREWAI_DISABLE_TELEMETRY"), os.environ.get("CREWAI_TRACING_ENABLED"))
"""


def test_crewai_is_hooked_on_its_first_import_and_its_telemetry_is_off() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWAI_")}
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["False", "True True True True true false"]
