"""The AutoGen calculator recipe (recipes/calc_autogen/): AutoGen AgentChat for real, through alight's
runner pool, proxy and store, against a scripted OpenAI-compatible server (a test fixture standing in
for a model, so answers are known) and against the embedded tiny model; and a short `alight train`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alight import LLM, semconv
from alight.adapters import SpanAdapter
from alight.entrypoints import resolve_entrypoint
from alight.types import Span, SpanKind
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call
from tests.recipes.stored_runs import selected_agents, stored_run

pytest.importorskip("autogen_agentchat")

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "calc_autogen"
AGENT, DATA = RECIPE / "agent.py", RECIPE / "data.py"
CALC = REPO / "recipes" / "calc"
CONFIG = REPO / "configs" / "calc_autogen.yaml"
SERVED_NAME = "policy"

solve = resolve_entrypoint(f"{AGENT}:solve")  # loaded as alight loads the agent
AGENT_NAME = resolve_entrypoint(f"{AGENT}:AGENT_NAME")
demonstrations = resolve_entrypoint(f"{DATA}:demonstrations")
openai_tool = resolve_entrypoint(f"{DATA}:openai_tool")
autogen_message = resolve_entrypoint(f"{DATA}:autogen_message")
make_problems = resolve_entrypoint(f"{CALC / 'data.py'}:make_problems")
calc_demonstrations = resolve_entrypoint(f"{CALC / 'data.py'}:demonstrations")
calculate = resolve_entrypoint(f"{CALC / 'agent.py'}:calculate")
CALCULATE_TOOL = resolve_entrypoint(f"{CALC / 'agent.py'}:CALCULATE_TOOL")
SUBMIT = resolve_entrypoint(f"{CALC / 'agent.py'}:SUBMIT")


# -- what the model is scripted to do, per question, and the reward calc's rule gives it ---------


@dataclass(frozen=True)
class Plan:
    """The scripted model's turns for one question: tool expressions in order, then its final text
    (None: it keeps calling the tool until the agent's turns run out)."""

    expressions: tuple[str, ...]
    final: str | None
    reward: float  # expected, worked out by hand from calc's rule
    model_calls: int


def plans(tasks: list[dict[str, Any]]) -> dict[str, Plan]:
    right, wrong_formula = tasks[0]["formula"], "a+b+1"  # never a*b, a-b or a+b of the templates' numbers
    values = [int(task["result"]) for task in tasks]
    return {
        tasks[0]["question"]: Plan((right,), SUBMIT, 1.0, 2),  # calls the tool, submits its result
        tasks[1]["question"]: Plan((), f"The answer is {values[1] + 7}.", 0.0, 1),  # a wrong number from its head
        tasks[2]["question"]: Plan((wrong_formula,), SUBMIT, 0.0, 2),  # the wrong arithmetic, submitted
        tasks[3]["question"]: Plan((tasks[3]["formula"],), f"It is {values[3]}.", 1.0, 2),  # tool, then own words
        tasks[4]["question"]: Plan((tasks[4]["formula"],) * 3, None, 0.0, 3),  # never answers: the turns run out
        tasks[5]["question"]: Plan((), str(values[5]), 1.0, 1),  # the right number straight away
    }


def script_for(tasks: list[dict[str, Any]]) -> Any:
    by_question = plans(tasks)

    def script(request: dict[str, Any]) -> dict[str, Any]:
        plan = by_question[request["messages"][0]["content"]]
        turn = sum(message["role"] == "tool" for message in request["messages"])
        if turn < len(plan.expressions):
            return tool_call("calculate", {"expression": plan.expressions[turn]})
        assert plan.final is not None, "the agent asked for more turns than it has"
        return answer(plan.final)

    return script


def tasks_of_the_script() -> list[dict[str, Any]]:
    return list(make_problems(6, seed=11, split="val"))


# -- the agent alone, against the scripted server --------------------------------------------------


def test_solve_scores_each_scripted_answer_as_calc_does() -> None:
    tasks = tasks_of_the_script()
    expected = plans(tasks)

    async def run_all() -> list[float]:
        with ScriptedOpenAIServer(script_for(tasks), model=None) as server:
            return [await solve(task, LLM(model="scripted", base_url=server.url)) for task in tasks]

    rewards = asyncio.run(run_all())
    assert rewards == [expected[task["question"]].reward for task in tasks] == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def test_the_warm_start_teaches_the_conversation_the_agent_holds(tiny_dir: Path) -> None:
    """What AutoGen sends for a tool call and its submission is, message for message, calc's
    conversation in the demonstrations' form, and renders through the tiny model's template as calc's
    demonstrations do: the warm start teaches what the agent sends."""
    transformers = pytest.importorskip("transformers")
    from alight.chat_template import template_messages

    task = make_problems(1, seed=5, split="val")[0]
    call_id = "call_0"  # the demonstrations' id

    def script(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "tool":
            return answer(SUBMIT)
        return tool_call("calculate", {"expression": task["formula"]}, call_id)

    async def run() -> tuple[float, list[dict[str, Any]]]:
        with ScriptedOpenAIServer(script, model=None) as server:
            reward = await solve(task, LLM(model="scripted", base_url=server.url))
        return reward, [received.body for received in server.requests]

    reward, (first, second) = asyncio.run(run())
    assert reward == 1.0
    arguments = json.dumps({"expression": task["formula"]})
    call = {"id": call_id, "type": "function", "function": {"name": "calculate", "arguments": arguments}}
    calc_form = [  # calc's demonstration of this conversation (recipes/calc/data.py)
        {"role": "user", "content": task["question"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": task["result"]},
    ]
    taught = [autogen_message(message) for message in calc_form]
    assert second["messages"] == taught and first["messages"] == taught[:1]
    assert first["tools"] == second["tools"] == [openai_tool()] == demonstrations(1)[0]["tools"]
    assert json.dumps(second["tools"]) == json.dumps([openai_tool()])  # key order too: templates render it

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)

    def rendered(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return str(tokenizer.apply_chat_template(template_messages(messages), tools=tools, tokenize=False))

    assert rendered(second["messages"], second["tools"]) == rendered(calc_form, [CALCULATE_TOOL])


def test_demonstrations_are_calcs_rows_in_autogens_form() -> None:
    ours, calcs = demonstrations(300, seed=2, tool_rate=0.4), calc_demonstrations(300, seed=2, tool_rate=0.4)
    assert len(ours) == len(calcs) == 300
    tool = openai_tool()
    assert tool["function"]["name"] == "calculate"
    assert tool["function"]["description"] == CALCULATE_TOOL["function"]["description"]
    assert list(tool["function"]["parameters"]["properties"]) == ["expression"]
    for row, calc_row in zip(ours, calcs, strict=True):
        assert row["tools"] == [tool]
        assert [m["role"] for m in row["messages"]] == [m["role"] for m in calc_row["messages"]]
        user, *turns = row["messages"]
        assert user == {"role": "user", "name": "user", "content": calc_row["messages"][0]["content"]}
        for ours_turn, calc_turn in zip(turns, calc_row["messages"][1:], strict=True):
            if calc_turn.get("tool_calls"):
                assert ours_turn == {"role": "assistant", "tool_calls": calc_turn["tool_calls"], "content": None}
            else:
                assert ours_turn == calc_turn


# -- through alight's runner pool, proxy and store ------------------------------------------------


@dataclass
class Loop:
    store_url: str
    upstream: ScriptedOpenAIServer


@pytest.fixture
def scripted_loop(tmp_path: Path, tiny_dir: Path) -> Iterator[Loop]:
    """Store server (SQLite) + proxy (LiteLLM engine -> the scripted server, token ids from the tiny
    model's tokenizer), the policy published as the `llm` resource."""
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
            yield Loop(store_server.url, upstream)
        finally:
            proxy_server.stop()


def run_through_pool(store_url: str, tasks: list[dict[str, Any]]) -> list[tuple[Any, list[Span]]]:
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.types import Rollout, Task

    async def run() -> list[tuple[Any, list[Span]]]:
        async with StoreClient(store_url) as store:
            rollouts = [Rollout(task=Task(input=task), timeout_s=60) for task in tasks]
            ids = [r.rollout_id for r in await store.enqueue(rollouts)]
            ended = await store.wait_for_rollouts(ids, timeout=120)
            assert len(ended) == len(ids), "rollouts did not end in time"
            return [(await store.get_rollout(i), await store.query_spans(i)) for i in ids]

    with RunnerPool(f"{AGENT}:solve", store_url, n_runners=2):
        return asyncio.run(run())


@pytest.mark.slow
def test_through_the_pool_rewards_spans_and_transitions_are_as_scripted(scripted_loop: Loop, tiny_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from alight.types import RolloutStatus

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    tasks = tasks_of_the_script()
    expected = plans(tasks)
    results = run_through_pool(scripted_loop.store_url, tasks)
    assert [rollout.reward for rollout, _ in results] == [expected[t["question"]].reward for t in tasks]
    trained, everything = SpanAdapter(agent_match=AGENT_NAME), SpanAdapter()
    for task, (rollout, spans) in zip(tasks, results, strict=True):
        plan = expected[task["question"]]
        assert rollout.status == RolloutStatus.SUCCEEDED, rollout
        # The AssistantAgent is an agent span inside the rollout's own, and makes every model call.
        agents = [(s.name, s.attributes[semconv.AGENT_NAME]) for s in spans if s.kind == SpanKind.AGENT]
        assert agents == [("solve", "solve"), (AGENT_NAME, AGENT_NAME)]
        llm = [s for s in spans if s.kind == SpanKind.LLM]
        assert len(llm) == plan.model_calls
        for span in llm:
            attrs = span.attributes
            assert attrs[semconv.LLM_SOURCE] == "proxy" and attrs[semconv.AGENT_NAME] == AGENT_NAME
            assert attrs[semconv.LLM_PROMPT_TOKEN_IDS] and attrs[semconv.LLM_RESPONSE_TOKEN_IDS]
            assert attrs[semconv.LLM_REQUEST_TOOLS] == [openai_tool()]
        # Each tool run is a `calculate` span of the assistant, holding calc's answer.
        numbers = resolve_entrypoint(f"{CALC / 'agent.py'}:question_numbers")(task["question"])
        tools = [s for s in spans if s.kind == SpanKind.TOOL]
        assert [s.name for s in tools] == ["calculate"] * len(plan.expressions)
        for span, expression in zip(tools, plan.expressions, strict=True):
            assert span.attributes[semconv.AGENT_NAME] == AGENT_NAME
            assert span.attributes[semconv.TOOL_ARGUMENTS] == {"expression": expression}
            assert span.attributes[semconv.TOOL_OUTPUT] == calculate(expression, numbers)
        # The adapter trains on the assistant's calls: all of them, and none under the rollout's name.
        adapted = trained.adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward)
        assert len(adapted.transitions) == plan.model_calls and adapted.episode_reward == plan.reward
        assert len(everything.adapt(spans, rollout_id=rollout.rollout_id).transitions) == plan.model_calls
        assert not SpanAdapter(agent_match="solve").adapt(spans, rollout_id=rollout.rollout_id).transitions
        first = adapted.transitions[0]
        prompt = tokenizer.decode(list(first.prompt_ids))
        assert "calculate(expression)" in prompt and task["question"] in prompt
        response = tokenizer.decode(list(first.response_ids))
        assert (plan.expressions[0] if plan.expressions else str(plan.final)) in response


# -- the real stack: the embedded tiny model -------------------------------------------------------


def alight(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


@pytest.mark.slow
def test_alight_dev_runs_the_agent_on_the_embedded_tiny_model(tmp_path: Path) -> None:
    from alight.store.sqlite import SqliteStore

    run_dir = tmp_path / "dev"
    done = alight("dev", str(CONFIG), "--n", "2", "--json", "--run-dir", str(run_dir), "runner.n_runners=1")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    assert [row["status"] for row in rows] == ["succeeded", "succeeded"], rows
    assert all(row["reward"] in (0.0, 1.0) for row in rows)

    async def spans() -> list[Span]:
        store = SqliteStore(run_dir / "store.db")
        try:
            return [s for row in rows for s in await store.query_spans(row["rollout_id"])]
        finally:
            await store.close()

    recorded = asyncio.run(spans())
    llm = [s for s in recorded if s.kind == SpanKind.LLM]
    assert len(llm) >= 2
    for span in llm:  # the engine's own token ids, for the AutoGen assistant
        assert span.attributes[semconv.AGENT_NAME] == AGENT_NAME
        assert span.attributes[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"
        assert span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
    assert {s.attributes[semconv.TOOL_NAME] for s in recorded if s.kind == SpanKind.TOOL} <= {"calculate"}


def formula_script(request: dict[str, Any]) -> dict[str, Any]:
    """A model that knows calc's three templates: the right formula, then `Done.`."""
    if request["messages"][-1]["role"] == "tool":
        return answer(SUBMIT)
    question = request["messages"][0]["content"]
    formula = "a*b" if " buys " in question else "a-b" if " sold " in question else "a+b"
    return tool_call("calculate", {"expression": formula})


@pytest.mark.slow
def test_alight_dev_against_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(formula_script, model=None) as upstream:
        done = alight(
            "dev", str(CONFIG), "--n", "3", "--json", "--endpoint", upstream.url, "--model", "scripted",
            "--run-dir", str(tmp_path / "dev"), "runner.n_runners=1",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    assert [(r["status"], r["reward"], r["llm_calls"], r["tool_calls"]) for r in rows] == [("succeeded", 1.0, 2, 1)] * 3
    assert len(upstream.requests) == 6


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_training_run_completes_and_records_rewards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    from alight.config import load_config, to_object
    from alight.trainer import Trainer

    short = [
        "warm_start.steps=10",
        "warm_start.size=100",
        "warm_start.batch_size=8",
        "trainer.steps=1",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.val_every=1",
        "data.val_size=2",
        "runner.n_runners=2",
        "engine.sampling.max_tokens=32",
        "logging.dashboard=false",
        "logging.plot=false",
        f"trainer.output_dir={tmp_path / 'runs'}",
    ]
    monkeypatch.chdir(REPO)
    result = Trainer(to_object(load_config(CONFIG, short))).fit()
    assert result.steps == 1 and not result.stopped
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert "warm_start/loss" in lines[0]
    for m in lines:
        assert 0.0 <= m["val/reward_mean"] <= 1.0
    assert 0.0 <= lines[1]["train/reward_mean"] <= 1.0
    assert lines[1]["rollouts/succeeded"] == 4 and lines[1]["transitions"] >= 4

    # What the embedded engine and the real pool recorded: the assistant's calls under its name,
    # token ids from the engine, `calculate` as the only tool; the adapter keeps every call.
    cfg = to_object(load_config(CONFIG, short))
    run = stored_run(result.run_dir)
    agents = run.llm_agents()
    assert set(agents) == {"calculator"} and agents["calculator"] >= 4, agents
    assert set(run.tools()) <= {"calculate"}
    assert run.token_id_sources() == {"engine"}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert selected_agents(run, cfg, tokenizer, "transition") == agents
    assert set(selected_agents(run, cfg, tokenizer, "trajectory")) == {"calculator"}
