"""The CrewAI calculator recipe (recipes/calc_crewai/): a real CrewAI crew through alight's runner pool,
proxy and store, against a scripted OpenAI-compatible server (a test fixture standing in for a model,
so the tool calls and answers are known) and against the embedded tiny model (`alight dev`).

CrewAI has its own extra (`alight[crewai]`): without it these tests skip, saying so."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alight import LLM, semconv
from alight.adapters import SpanAdapter
from alight.entrypoints import resolve_entrypoint
from alight.types import Span, SpanKind, SpanStatus
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call

pytest.importorskip("crewai", reason='CrewAI is not installed (pip install "alight[crewai]")')
pytestmark = pytest.mark.crewai

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "calc_crewai"
AGENT, DATA, CALC = RECIPE / "agent.py", RECIPE / "data.py", REPO / "recipes" / "calc"
CONFIG = REPO / "configs" / "calc_crewai.yaml"
SERVED_NAME = "policy"

solve = resolve_entrypoint(f"{AGENT}:solve")  # loaded as alight loads the agent
AGENT_NAME = resolve_entrypoint(f"{AGENT}:AGENT_NAME")
openai_tool = resolve_entrypoint(f"{DATA}:openai_tool")
crewai_message = resolve_entrypoint(f"{DATA}:crewai_message")
system_message = resolve_entrypoint(f"{DATA}:system_message")
demonstrations = resolve_entrypoint(f"{DATA}:demonstrations")
make_problems = resolve_entrypoint(f"{CALC / 'data.py'}:make_problems")
calculate = resolve_entrypoint(f"{CALC / 'agent.py'}:calculate")
question_numbers = resolve_entrypoint(f"{CALC / 'agent.py'}:question_numbers")
SUBMIT = resolve_entrypoint(f"{CALC / 'agent.py'}:SUBMIT")


@pytest.fixture(autouse=True)
def crewai_data_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CrewAI keeps each kickoff's task outputs under the user's data folder: a temporary one here."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def question_of(request: dict[str, Any]) -> str:
    return str(request["messages"][1]["content"])  # CrewAI's task prompt, after its system prompt


def tasks_of_the_script() -> list[dict[str, Any]]:
    return list(make_problems(3, seed=11, split="val"))


def script_for(tasks: list[dict[str, Any]]) -> Any:
    """Task 0: the right formula, then `Done.` (1.0). Task 1: a wrong number from its head (0.0).
    Task 2: the tool until CrewAI's turns run out, then, asked without tools, the right number (1.0)."""

    def script(request: dict[str, Any]) -> dict[str, Any]:
        question, turn = question_of(request), sum(m["role"] == "tool" for m in request["messages"])
        if tasks[0]["question"] in question:
            return tool_call("calculate", {"expression": tasks[0]["formula"]}) if turn == 0 else answer(SUBMIT)
        if tasks[1]["question"] in question:
            return answer(f"It is {int(tasks[1]['result']) + 7}.")
        if "tools" in request:
            return tool_call("calculate", {"expression": f"{tasks[2]['formula']}+{turn}"})
        return answer(str(tasks[2]["result"]))

    return script


#: per task: (reward, model calls, tool expressions)
def expected(tasks: list[dict[str, Any]]) -> list[tuple[float, int, list[str]]]:
    return [(1.0, 2, [tasks[0]["formula"]]), (0.0, 1, []), (1.0, 3, [f"{tasks[2]['formula']}+{t}" for t in (0, 1)])]


def test_the_demonstrations_are_what_the_crew_sends() -> None:
    """What CrewAI sends for a tool call and its submission is, message for message, calc's conversation
    in the demonstrations' form: the warm start teaches what the agent sends."""
    task = make_problems(1, seed=5, split="val")[0]

    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "tool":
            return answer(SUBMIT)
        return tool_call("calculate", {"expression": task["formula"]}, "call_0")  # the demonstrations' id

    with ScriptedOpenAIServer(script, model=None) as server:
        assert solve(task, LLM(model="scripted", base_url=server.url)) == 1.0
    first, second = (received.body for received in server.requests)
    call = {"id": "call_0", "type": "function", "function": {"name": "calculate", "arguments": ""}}
    call["function"]["arguments"] = json.dumps({"expression": task["formula"]})
    calc_form = [
        {"role": "user", "content": task["question"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": task["result"]},
    ]
    taught = [system_message(), *(crewai_message(m) for m in calc_form)]
    assert second["messages"] == taught and first["messages"] == taught[:2]
    assert first["tools"] == second["tools"] == [openai_tool()] == demonstrations(1)[0]["tools"]
    assert json.dumps(second["tools"]) == json.dumps([openai_tool()])  # key order too: templates render it


@pytest.fixture
def scripted_loop(tmp_path: Path, tiny_dir: Path) -> Iterator[str]:
    """Store server (SQLite) + proxy (LiteLLM engine -> the scripted server, token ids from the tiny
    model's tokenizer), the policy published as the `llm` resource. Yields the store's URL."""
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore
    from alight.types import LLMResource

    async def publish(store_url: str, proxy_url: str) -> None:
        async with StoreClient(store_url) as store:
            await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model=SERVED_NAME)})

    with (
        ScriptedOpenAIServer(script_for(tasks_of_the_script()), model=None) as upstream,
        StoreServer(SqliteStore(tmp_path / "store.db")) as store_server,
    ):
        engine = LiteLLMEngine(
            f"openai/{SERVED_NAME}", base_url=upstream.url, served_name=SERVED_NAME, tokenizer=tiny_dir
        )
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            asyncio.run(publish(store_server.url, proxy_server.url))
            yield store_server.url
        finally:
            proxy_server.stop()


def run_through_pool(store_url: str, tasks: list[dict[str, Any]]) -> list[tuple[Any, list[Span]]]:
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.types import Rollout, Task

    async def run() -> list[tuple[Any, list[Span]]]:
        async with StoreClient(store_url) as store:
            rollouts = [Rollout(task=Task(input=task), timeout_s=90) for task in tasks]
            ids = [r.rollout_id for r in await store.enqueue(rollouts)]
            ended = await store.wait_for_rollouts(ids, timeout=180)
            assert len(ended) == len(ids), "rollouts did not end in time"
            return [(await store.get_rollout(i), await store.query_spans(i)) for i in ids]

    with RunnerPool(f"{AGENT}:solve", store_url, n_runners=1):
        return asyncio.run(run())


@pytest.mark.slow
def test_a_crew_through_the_pool_names_its_agent_and_tools_and_the_adapter_selects_its_calls(
    scripted_loop: str,
) -> None:
    from alight.types import RolloutStatus

    tasks = tasks_of_the_script()
    results = run_through_pool(scripted_loop, tasks)
    assert [rollout.reward for rollout, _ in results] == [reward for reward, _, _ in expected(tasks)]
    for task, (rollout, spans), (reward, calls, expressions) in zip(tasks, results, expected(tasks), strict=True):
        assert rollout.status == RolloutStatus.SUCCEEDED, rollout
        # The crew's Agent is an agent span named by its role inside the rollout's own ...
        agents = [s for s in spans if s.kind == SpanKind.AGENT]
        assert [(s.name, s.attributes[semconv.AGENT_NAME]) for s in agents] == [("solve", "solve"), (AGENT_NAME,) * 2]
        crew_agent = agents[1]
        assert crew_agent.parent_id == agents[0].span_id and crew_agent.status == SpanStatus.OK
        # ... and makes every model call: the proxy's spans (token ids) nest under it.
        llm = [s for s in spans if s.kind == SpanKind.LLM]
        assert len(llm) == calls
        for span in llm:
            assert span.attributes[semconv.LLM_SOURCE] == "proxy"
            assert span.attributes[semconv.AGENT_NAME] == AGENT_NAME and span.parent_id == crew_agent.span_id
            assert span.attributes[semconv.LLM_PROMPT_TOKEN_IDS] and span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
        assert llm[0].attributes[semconv.LLM_REQUEST_TOOLS] == [openai_tool()]
        # Each tool run is a `calculate` span of the agent: the model's arguments, calc's result.
        tools = [s for s in spans if s.kind == SpanKind.TOOL]
        assert [s.attributes[semconv.TOOL_ARGUMENTS] for s in tools] == [{"expression": e} for e in expressions]
        numbers = question_numbers(task["question"])
        for span, expression in zip(tools, expressions, strict=True):
            assert span.name == span.attributes[semconv.TOOL_NAME] == "calculate"
            assert span.attributes[semconv.AGENT_NAME] == AGENT_NAME and span.parent_id == crew_agent.span_id
            assert span.attributes[semconv.TOOL_OUTPUT] == calculate(expression, numbers)
            assert span.attributes[semconv.TOOL_CALL_ID].startswith("call_")  # the model's call, claimed
        order = sorted(llm + tools, key=lambda s: s.sequence_id or 0)  # model call, tool run, model call, ...
        assert [s.kind for s in order][:2] == ([SpanKind.LLM, SpanKind.TOOL] if tools else [SpanKind.LLM])
        # The adapter trains on the agent's calls: all of them, none under the rollout's name.
        adapted = SpanAdapter(agent_match=AGENT_NAME).adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward)
        assert len(adapted.transitions) == calls and adapted.episode_reward == reward
        assert not SpanAdapter(agent_match="solve").adapt(spans, rollout_id=rollout.rollout_id).transitions


@pytest.mark.slow
def test_alight_dev_runs_the_crew_on_the_embedded_tiny_model(tmp_path: Path) -> None:
    from alight.store.sqlite import SqliteStore

    run_dir = tmp_path / "dev"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "NO_COLOR": "1", "COLUMNS": "200"}
    args = ["dev", str(CONFIG), "--n", "2", "--json", "--run-dir", str(run_dir), "runner.n_runners=1"]
    done = subprocess.run(
        [sys.executable, "-m", "alight", *args, "engine.sampling.max_tokens=24"],
        capture_output=True, text=True, timeout=240, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    assert [row["status"] for row in rows] == ["succeeded", "succeeded"], rows

    async def spans() -> list[Span]:
        store = SqliteStore(run_dir / "store.db")
        try:
            return [s for row in rows for s in await store.query_spans(row["rollout_id"])]
        finally:
            await store.close()

    recorded = asyncio.run(spans())
    llm = [s for s in recorded if s.kind == SpanKind.LLM]
    assert len(llm) >= 2
    for span in llm:  # the engine's own token ids, for the crew's agent
        assert span.attributes[semconv.AGENT_NAME] == AGENT_NAME
        assert span.attributes[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"
        assert span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
    assert {s.attributes[semconv.TOOL_NAME] for s in recorded if s.kind == SpanKind.TOOL} <= {"calculate"}
