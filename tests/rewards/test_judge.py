"""reward.kind=judge through the real parts: a SQLite store behind its server, the LLM proxy, a
runner running `JudgedAgent`, the adapter and LightningRL's columnar batch.

No model here can judge, so scripted stand-ins play one: `JudgingEngine` (a scripted engine behind
the proxy, the policy as its own judge) and a `ScriptedOpenAIServer` (the judge's own endpoint,
reached through LiteLLM). Both answer the judge with verdicts fixed per answer, so the expected
rewards are known exactly; the server counts the judge calls that reach it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from alight import semconv
from alight.adapters import SpanAdapter
from alight.agent import LLM, rollout
from alight.algorithms.lightning import LightningRL
from alight.config.schema import AdapterConfig, AlgorithmConfig, JudgeConfig, RewardConfig
from alight.engines.base import ChatRequest, Generation
from alight.errors import ConfigError
from alight.proxy import Proxy
from alight.proxy.server import ProxyServer
from alight.rewards.checks import check_reward
from alight.rewards.judge import JudgedAgent
from alight.rewards.judge_cache import CACHE_FILE
from alight.rewards.judge_score import JudgeAnswerError, parse_score
from alight.runner import Runner
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.tracing import make_tracer
from alight.types import AttemptStatus, LLMResource, Rollout, RolloutStatus, SpanKind, Task
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer
from tests.proxy.scripted import ScriptedEngine

pytestmark = pytest.mark.anyio

#: The policy's answer to each question, and the judge's verdict on each answer.
ANSWERS = {"2+3?": "It is 5.", "2+5?": "It is 7.", "2+9?": "It is 11."}
VERDICTS = {"It is 5.": '{"score": 8}', "It is 7.": "Reasoning: fine.\nScore: 3/10", "It is 11.": "I cannot say."}


def _verdict(messages: list[dict[str, Any]]) -> str:
    prompt = str(messages[-1]["content"])
    return next((verdict for text, verdict in VERDICTS.items() if text in prompt), "no idea")


def _is_judgement(messages: list[dict[str, Any]]) -> bool:
    return messages[0]["role"] == "system" and "judge" in str(messages[0]["content"])


class JudgingEngine(ScriptedEngine):
    """A policy that answers the questions of `ANSWERS` and, asked as a judge, gives `VERDICTS`."""

    async def chat(self, request: ChatRequest) -> Generation:
        self.requests.append(request)
        messages = request.messages
        text = _verdict(messages) if _is_judgement(messages) else ANSWERS.get(str(messages[-1]["content"]), "?")
        return self._generation(messages, text, {"role": "assistant", "content": text}, "stop")


def judge_server_script(request: dict[str, Any]) -> dict[str, Any]:
    return answer(_verdict(request["messages"]))


@rollout(name="solver")
async def solver(task: dict[str, Any], llm: LLM) -> float:
    """Asks the policy once; returns a reward of its own, which the judge's replaces."""
    body = {"model": llm.model, "messages": [{"role": "user", "content": task["question"]}]}
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{llm.base_url}/chat/completions", json=body)
    response.raise_for_status()
    return 0.123


#: The solver as runners get it (pool workers import it by name).
SOLVER = "tests.rewards.test_judge:solver"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[StoreServer, ProxyServer, JudgingEngine]]:
    engine = JudgingEngine()
    with StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=None) as store_server:
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            yield store_server, proxy_server, engine
        finally:
            proxy_server.stop()


async def run_rollouts(
    stack: tuple[StoreServer, ProxyServer, JudgingEngine], agent: JudgedAgent, questions: list[str]
) -> list[Rollout]:
    store_server, proxy_server, _ = stack
    async with StoreClient(store_server.url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_server.url, model="scripted")})
        queued = await store.enqueue([Rollout(task=Task(input={"question": q})) for q in questions])
        runner = Runner(agent, store, tracer=make_tracer("light"), heartbeat_interval_s=0.2)
        assert await runner.run(max_rollouts=len(questions), idle_exit_s=1.0) == len(questions)
        return [await store.get_rollout(r.rollout_id) for r in queued]


def judge(**fields: Any) -> JudgeConfig:
    return JudgeConfig(**{"max_score": 10.0, **fields})


# -- the policy as its own judge, through the proxy ----------------------------------------------


async def test_the_policy_judges_through_the_proxy_and_its_calls_are_never_trained_on(
    stack: tuple[StoreServer, ProxyServer, JudgingEngine], tmp_path: Path
) -> None:
    agent = JudgedAgent(solver, judge(model="policy"), cache_path=tmp_path / CACHE_FILE)
    done = await run_rollouts(stack, agent, ["2+3?", "2+5?"])
    # {"score": 8} and "Score: 3/10" on a scale of 10; the agent's own 0.123 is replaced.
    assert [(r.status, r.reward) for r in done] == [(RolloutStatus.SUCCEEDED, 0.8), (RolloutStatus.SUCCEEDED, 0.3)]

    store = SqliteStore(tmp_path / "store.db")  # a second connection, as the trainer reads it
    try:
        for finished in done:
            spans = await store.query_spans(finished.rollout_id)
            calls = [s for s in spans if s.kind is SpanKind.LLM]
            agents = [s.attributes.get(semconv.AGENT_NAME) for s in calls]
            assert agents == ["solver", semconv.JUDGE_AGENT]  # both recorded by the proxy, with token ids
            assert all(s.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for s in calls)
            adapted = SpanAdapter().adapt(spans, rollout_id=finished.rollout_id, reward=finished.reward)
            assert [t.agent_name for t in adapted.transitions] == ["solver"]
            assert adapted.transitions[0].span_id == calls[0].span_id
        # The trainer's columnar path drops them too: one transition per rollout, two calls skipped.
        pipeline = LightningRL.from_config(AdapterConfig(), AlgorithmConfig())
        assert pipeline.columnar
        batch, stats = await pipeline.batch_from_store(store, [r.rollout_id for r in done], pad_id=0)
        assert batch is not None and (stats.transitions, stats.calls_skipped_agent) == (2, 2)
    finally:
        await store.close()


# -- a judge model of its own (LiteLLM to a scripted endpoint) -------------------------------------


async def test_exact_scores_and_a_second_identical_judgement_is_not_asked(
    stack: tuple[StoreServer, ProxyServer, JudgingEngine], tmp_path: Path
) -> None:
    cache = tmp_path / CACHE_FILE
    with ScriptedOpenAIServer(judge_server_script) as judge_server:
        config = judge(model="openai/judge", base_url=judge_server.url)
        agent = JudgedAgent(SOLVER, config, cache_path=cache)
        done = await run_rollouts(stack, agent, ["2+3?", "2+5?", "2+3?"])
        assert [r.reward for r in done] == [0.8, 0.3, 0.8]
        assert len(judge_server.requests) == 2  # the second "2+3?" was scored from the cache

        # Another runner process (the agent as a pool worker gets it) shares the run's cache file.
        elsewhere = pickle.loads(pickle.dumps(agent))
        assert [r.reward for r in await run_rollouts(stack, elsewhere, ["2+5?"])] == [0.3]
        assert len(judge_server.requests) == 2

        # Another rubric is another judgement: asked again.
        rubric = "Grade the answer {answer} to the question {task}."
        other = JudgedAgent(
            solver, judge(model="openai/judge", base_url=judge_server.url, rubric=rubric), cache_path=cache
        )
        assert [r.reward for r in await run_rollouts(stack, other, ["2+3?"])] == [0.8]
        assert len(judge_server.requests) == 3
        assert judge_server.requests[-1].body["messages"][1]["content"] == rubric.format(
            task='{"question": "2+3?"}', answer="It is 5."
        )

        # Without the cache, every judgement is asked.
        uncached = JudgedAgent(SOLVER, judge(model="openai/judge", base_url=judge_server.url, cache=False))
        await run_rollouts(stack, uncached, ["2+3?", "2+3?"])
        assert len(judge_server.requests) == 5

    store = SqliteStore(tmp_path / "store.db")
    try:
        spans = await store.query_spans(done[0].rollout_id)
        judged = [
            s for s in spans if s.kind is SpanKind.LLM and s.attributes.get(semconv.AGENT_NAME) == semconv.JUDGE_AGENT
        ]
        assert len(judged) == 1 and judged[0].attributes[semconv.LLM_RESPONSE_MESSAGE]["content"] == '{"score": 8}'
        adapted = SpanAdapter().adapt(spans, rollout_id=done[0].rollout_id, reward=done[0].reward)
        assert [t.agent_name for t in adapted.transitions] == ["solver"]
    finally:
        await store.close()


async def test_a_garbage_judgement_fails_its_attempt_with_the_reason_and_the_run_goes_on(
    stack: tuple[StoreServer, ProxyServer, JudgingEngine], tmp_path: Path
) -> None:
    with ScriptedOpenAIServer(judge_server_script) as judge_server:
        agent = JudgedAgent(SOLVER, judge(model="openai/judge", base_url=judge_server.url), cache_path=tmp_path / "c")
        done = await run_rollouts(stack, agent, ["2+9?", "2+3?", "2+9?"])
        assert [(r.status, r.reward) for r in done] == [
            (RolloutStatus.FAILED, None),
            (RolloutStatus.SUCCEEDED, 0.8),
            (RolloutStatus.FAILED, None),
        ]
        assert len(judge_server.requests) == 3  # a garbage answer is not cached: asked again
    store_server, _, _ = stack
    async with StoreClient(store_server.url) as store:
        [attempt] = await store.list_attempts(done[0].rollout_id)
    assert attempt.status is AttemptStatus.FAILED
    assert attempt.error == "judge: no score in its answer ('I cannot say.')"


async def test_a_failed_judge_call_fails_the_attempt_in_one_line(
    stack: tuple[StoreServer, ProxyServer, JudgingEngine],
) -> None:
    agent = JudgedAgent(SOLVER, judge(model="openai/judge", base_url="http://127.0.0.1:9/v1"))
    [done] = await run_rollouts(stack, agent, ["2+3?"])
    store_server, _, _ = stack
    async with StoreClient(store_server.url) as store:
        [attempt] = await store.list_attempts(done.rollout_id)
    assert done.status is RolloutStatus.FAILED
    assert attempt.error is not None and attempt.error.startswith("judge: the call to openai/judge failed")
    assert "\n" not in attempt.error and "Traceback" not in attempt.error


# -- parsing and checks (no model) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "max_score", "expected"),
    [
        ('{"score": 7}', 10, 7.0),
        ('Looks right. {"score": "9.5"}', 10, 9.5),
        ("Score: 7/10", 10, 7.0),
        ("score: 4 / 5", 10, 8.0),  # a fraction on another scale is rescaled
        ("Final score = 3 out of 10", 10, 3.0),
        ("The answer is complete.\n\n**4**", 5, 4.0),
        ("2/4", 1, 0.5),
        ("<think>score 1</think>\n6", 10, 6.0),
        ("0", 10, 0.0),
        ("10", 10, 10.0),
    ],
)
def test_scores_judges_write(text: str, max_score: float, expected: float) -> None:
    assert parse_score(text, max_score) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I would give it a seven.", "no score in its answer"),
        ("", "no score in its answer ('an empty answer')"),
        ('{"score": NaN}', "is not a finite number"),
        ("Score: 11", "its score 11 is outside [0, 10]"),
        ("-1", "its score -1 is outside [0, 10]"),
        ("3/0", "is not a finite number"),
    ],
)
def test_unusable_judgements_say_why(text: str, reason: str) -> None:
    with pytest.raises(JudgeAnswerError, match=r"^judge: ") as caught:
        parse_score(text, 10)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (RewardConfig(kind="jury"), "reward.kind must be one of agent, tests, judge, got 'jury'"),
        (RewardConfig(kind="judge", judge=JudgeConfig(rubric="Rate {task}.")), "must contain the placeholder {answer}"),
        (RewardConfig(kind="judge", judge=JudgeConfig(max_score=0)), "max_score must be a positive number, got 0"),
        (RewardConfig(kind="judge", judge=JudgeConfig(max_score=float("nan"))), "max_score must be a positive number"),
        (RewardConfig(kind="judge", judge=JudgeConfig(max_tokens=0)), "max_tokens must be at least 1"),
    ],
)
def test_bad_reward_settings_are_one_line_config_errors(reward: RewardConfig, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_reward(reward)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_default_reward_and_a_good_judge_pass() -> None:
    check_reward(RewardConfig())
    check_reward(RewardConfig(kind="judge", judge=JudgeConfig(rubric='{answer} for {task}: {"score": s}')))


def test_a_judged_agent_keeps_its_agents_name_and_travels_as_an_entrypoint(tmp_path: Path) -> None:
    agent = JudgedAgent("tests.fixtures.sample_agents:calculator", judge(), cache_path=tmp_path / CACHE_FILE)
    assert agent.name == "calculator"
    copy = pickle.loads(pickle.dumps(agent))
    assert (copy.name, copy.agent, copy._loaded, copy.cache.path) == ("calculator", agent.agent, None, agent.cache.path)
