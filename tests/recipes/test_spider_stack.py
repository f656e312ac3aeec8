"""The Spider recipe through alight's real stack: the LangGraph agent run by the runner pool, its
model calls going through the LLM proxy to a scripted OpenAI-compatible server (a test fixture
standing in for a model, tests.recipes.spider_script) on loopback, spans in a store server.

Checks the spans (agents and the run_sql tool with its SQL), the rewards, the AIR rewards of
configs/spider.yaml, the adapter's selection (writer and rewriter, never the checker) in both
adapter modes, `alight dev`'s execution accuracy, and a short `alight train` on the tiny model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.algorithms.air import air_rewards, parse_air_rules
from alight.config import load_config, to_object
from alight.config.schema import ExperimentConfig
from alight.entrypoints import resolve_entrypoint
from alight.types import Rollout, RolloutStatus, Span, SpanKind, Task
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.recipes.spider_script import CHECK_PROMPT, EXPECTED, KINDS, plans_for, spider_script
from tests.recipes.stored_runs import selected_agents, stored_run

pytestmark = pytest.mark.slow
pytest.importorskip("langgraph", reason="the agents extra runs the recipe's LangGraph agent")
pytest.importorskip("langchain_openai", reason="the agents extra runs the recipe's LangGraph agent")

REPO = Path(__file__).resolve().parents[2]
SPIDER = REPO / "configs" / "spider.yaml"
AGENT = "recipes/spider/agent.py:sql_agent"
SERVED_NAME = "policy"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = resolve_entrypoint(f"{REPO / 'recipes' / 'spider' / 'bundled.py'}:build_dataset")
    return Path(build(tmp_path_factory.mktemp("spider")))


def spider_config(bundled: Path, tmp_path: Path, *overrides: str) -> ExperimentConfig:
    base = [f"data.generator_kwargs.spider_dir={bundled}", f"trainer.output_dir={tmp_path / 'runs'}"]
    return to_object(load_config(SPIDER, [*base, *overrides]))


def dev_tasks(bundled: Path, n: int) -> list[dict[str, Any]]:
    make_tasks = resolve_entrypoint(f"{REPO / 'recipes' / 'spider' / 'data.py'}:make_tasks")
    return list(make_tasks("val", n=n, spider_dir=str(bundled)))


# -- the runner pool, the proxy and a store server -------------------------------------------------


@dataclass
class Recorded:
    kinds: list[str]
    rollouts: list[Rollout]
    spans: dict[str, list[Span]]


async def _publish_and_run(
    store_url: str, proxy_url: str, tasks: list[dict[str, Any]]
) -> tuple[list[Rollout], dict[str, list[Span]]]:
    from alight.store.client import StoreClient
    from alight.types import LLMResource

    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model=SERVED_NAME)})
        queued = [Rollout(task=Task(input=task), group_id="g", timeout_s=60) for task in tasks]
        ids = [r.rollout_id for r in await store.enqueue(queued)]
        assert len(await store.wait_for_rollouts(ids, timeout=120)) == len(ids), "rollouts did not end in time"
        return [await store.get_rollout(i) for i in ids], {i: await store.query_spans(i) for i in ids}


@pytest.fixture(scope="module")
def recorded(bundled: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One rollout of each kind (correct, wrong, broken, fixed), max_turns 2, run by the pool."""
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    tasks = dev_tasks(bundled, len(KINDS))
    kinds = list(KINDS)
    with (
        ScriptedOpenAIServer(spider_script(plans_for(tasks, kinds))) as upstream,
        StoreServer(SqliteStore(tmp_path_factory.mktemp("store") / "store.db")) as store_server,
    ):
        engine = LiteLLMEngine(f"openai/{SERVED_NAME}", base_url=upstream.url, served_name=SERVED_NAME)
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            with RunnerPool(str(REPO / AGENT), store_server.url, n_runners=2):
                rollouts, spans = asyncio.run(_publish_and_run(store_server.url, proxy_server.url, tasks))
        finally:
            proxy_server.stop()
    yield Recorded(kinds, rollouts, spans)


def test_rollouts_end_with_the_execution_accuracy_reward(recorded: Recorded) -> None:
    for kind, rollout in zip(recorded.kinds, recorded.rollouts, strict=True):
        assert rollout.status == RolloutStatus.SUCCEEDED, (kind, rollout)
        assert rollout.reward == EXPECTED[kind].reward, kind


def test_spans_name_the_graph_nodes_and_the_sql_tool(recorded: Recorded) -> None:
    for kind, rollout in zip(recorded.kinds, recorded.rollouts, strict=True):
        spans, expected = recorded.spans[rollout.rollout_id], EXPECTED[kind]
        llm = [s for s in spans if s.kind == SpanKind.LLM]
        assert tuple(s.attributes.get(semconv.AGENT_NAME) for s in llm) == expected.llm_agents, kind
        assert all(s.attributes[semconv.LLM_SOURCE] == "proxy" for s in llm)
        checker = [s for s in llm if s.attributes[semconv.AGENT_NAME] == "check_query"]
        assert all(s.attributes[semconv.LLM_REQUEST_MESSAGES][0]["content"] == CHECK_PROMPT for s in checker)
        agents = [s.name for s in spans if s.kind == SpanKind.AGENT]
        assert {"write_query", "execute_query", "check_query"} <= set(agents)
        tools = [s for s in spans if s.kind == SpanKind.TOOL]
        assert [t.name for t in tools] == ["run_sql"] * len(expected.tool_errors), kind
        replies = [
            s.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"]
            for s in llm
            if s.attributes[semconv.AGENT_NAME] != "check_query"
        ]
        for tool, failed, reply in zip(tools, expected.tool_errors, replies, strict=True):
            assert tool.attributes[semconv.AGENT_NAME] == "execute_query"
            assert tool.attributes[semconv.TOOL_ERROR] is failed, kind
            assert (tool.status.value == "error") is failed
            sql = tool.attributes[semconv.TOOL_SQL]  # what AIR's sql rules read
            assert sql and sql in reply and tool.attributes[semconv.TOOL_ARGUMENTS] == {"sql": sql}


def test_air_rules_of_the_config_reward_each_query(recorded: Recorded, bundled: Path, tmp_path: Path) -> None:
    rules = parse_air_rules(spider_config(bundled, tmp_path).adapter.air)
    for kind, rollout in zip(recorded.kinds, recorded.rollouts, strict=True):
        got = [value for _, value in air_rewards(recorded.spans[rollout.rollout_id], rules)]
        assert got == pytest.approx(list(EXPECTED[kind].air)), kind


@pytest.mark.parametrize("mode", ["transition", "trajectory"])
def test_the_adapter_trains_the_writer_and_rewriter_never_the_checker(
    recorded: Recorded, bundled: Path, tmp_path: Path, tiny_dir: Path, mode: str
) -> None:
    """The scripted server returns no token ids, so the adapter rebuilds them with the tiny
    model's tokenizer (as it does for any endpoint that does not return them)."""
    from transformers import AutoTokenizer

    from alight.algorithms import LightningRL

    cfg = spider_config(bundled, tmp_path, f"adapter.mode={mode}")
    assert cfg.adapter.agent_match == "write_query|rewrite_query"
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    pipeline = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=tokenizer)
    everything = LightningRL.from_config(dataclasses.replace(cfg.adapter, agent_match=None), tokenizer=tokenizer)
    for kind, rollout in zip(recorded.kinds, recorded.rollouts, strict=True):
        spans, expected = recorded.spans[rollout.rollout_id], EXPECTED[kind]
        adapted = pipeline.adapter.adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward)
        got = [(t.agent_name, round(t.reward, 6)) for t in adapted.transitions]
        assert got == [(agent, air) for agent, air in expected.trained], (mode, kind)
        assert adapted.episode_reward == expected.reward
        for transition in adapted.transitions:
            assert CHECK_PROMPT not in tokenizer.decode(transition.prompt_ids)
        every = everything.adapter.adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward)
        assert "check_query" in [t.agent_name for t in every.transitions]  # the checker's calls exist
    transitions, stats = pipeline.adapt_rollouts(recorded.rollouts, recorded.spans)
    assert stats.calls_skipped_agent == sum(
        1 for k in recorded.kinds for a in EXPECTED[k].llm_agents if a == "check_query"
    )
    assert {t.agent_name for t in transitions} == {"write_query", "rewrite_query"}
    assert all(t.advantage is not None for t in transitions)


# -- alight dev: execution accuracy against an OpenAI-compatible endpoint -----------------------------


def test_dev_measures_execution_accuracy_exactly(bundled: Path, tmp_path: Path) -> None:
    from alight.commands.dev import run_dev
    from alight.trainer.tasks import dev_rows

    cfg = spider_config(bundled, tmp_path, "runner.n_runners=2")
    n = 8
    _, tasks = dev_rows(cfg, n)  # the questions dev runs, in its order
    kinds = [KINDS[i % len(KINDS)] for i in range(n)]
    with ScriptedOpenAIServer(spider_script(plans_for(tasks, kinds))) as server:
        run = run_dev(cfg, tmp_path / "dev", n=n, endpoint=server.url, model=SERVED_NAME)
    assert [r.task["question"] for r in run.results] == [t["question"] for t in tasks]
    assert [r.status for r in run.results] == ["succeeded"] * n
    assert [r.reward for r in run.results] == [EXPECTED[k].reward for k in kinds]
    assert [r.tool_calls for r in run.results] == [len(EXPECTED[k].tool_errors) for k in kinds]
    accuracy = sum(r.reward or 0.0 for r in run.results) / n
    assert accuracy == 0.5  # correct and fixed succeed; wrong and broken do not


# -- a short training run on the tiny model -------------------------------------------------------


@pytest.mark.timeout(300)
def test_short_spider_training_completes_and_records_rewards(
    bundled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None, tiny_dir: Path
) -> None:
    from alight.store.sqlite import SqliteStore
    from alight.trainer import Trainer
    from alight.types import RolloutMode

    monkeypatch.chdir(REPO)
    cfg = spider_config(
        bundled,
        tmp_path,
        "warm_start.steps=2",
        "warm_start.size=16",
        "warm_start.batch_size=4",
        "trainer.steps=1",
        "trainer.batch_size=2",
        "trainer.group_size=2",
        "trainer.val_every=1",
        "data.val_size=2",
        "runner.n_runners=2",
        "engine.sampling.max_tokens=24",
        "logging.dashboard=false",
        "logging.plot=false",
    )
    result = Trainer(cfg).fit()
    assert result.steps == 1 and not result.stopped
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert all(0.0 <= m["val/reward_mean"] <= 1.0 for m in lines)
    assert 0.0 <= lines[1]["train/reward_mean"] <= 1.0 and lines[1]["rollouts/succeeded"] == 4
    assert lines[1]["transitions"] >= 4  # the writer's calls at least; the checker's are not trained

    async def train_rollouts() -> list[Rollout]:
        store = SqliteStore(result.run_dir / "store.db")
        try:
            return await store.list_rollouts(mode=RolloutMode.TRAIN)
        finally:
            await store.close()

    rollouts = asyncio.run(train_rollouts())
    assert len(rollouts) == 4 and all(r.reward is not None for r in rollouts)

    # What the embedded engine and the real pool recorded: the graph's nodes as agents (the untrained
    # model never answers CORRECT, so each rollout writes, checks, rewrites), run_sql as the tool,
    # token ids from the engine; the adapter keeps the writer's and rewriter's calls only.
    from transformers import AutoTokenizer

    run = stored_run(result.run_dir)
    agents = run.llm_agents()
    assert set(agents) == {"write_query", "check_query", "rewrite_query"}, agents
    assert agents["write_query"] == 4 and agents["check_query"] == agents["rewrite_query"] == 4
    assert run.tools() == {"run_sql": 8}  # two queries per rollout (max_turns 2)
    assert run.token_id_sources() == {"engine"}
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    for mode in ("transition", "trajectory"):
        selected = selected_agents(run, cfg, tokenizer, mode)
        assert set(selected) == {"write_query", "rewrite_query"}, (mode, selected)
        if mode == "transition":
            assert selected == {"write_query": 4, "rewrite_query": 4}
