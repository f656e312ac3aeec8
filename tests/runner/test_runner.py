"""One `Runner` in-process on a MemoryStore: rewards, resources, failures and timeouts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from alight import semconv
from alight.agent import LLM, LitAgent, rollout
from alight.store import MemoryStore
from alight.tracing import emit_reward, make_tracer
from alight.types import AttemptStatus, LLMResource, PromptTemplate, Rollout, RolloutStatus, SpanKind, Task

pytestmark = pytest.mark.anyio


def _runner(agent: LitAgent, store: MemoryStore, **kwargs: Any) -> Any:
    from alight.runner import Runner

    # No instrumentation: these agents make no LLM calls, and hooking openai & co. takes seconds.
    return Runner(agent, store, tracer=make_tracer("light"), instrument=False, heartbeat_interval_s=0.1, **kwargs)


async def _one(store: MemoryStore, agent: LitAgent, **rollout_fields: Any) -> Rollout:
    [queued] = await store.enqueue([Rollout(task=Task(input=rollout_fields.pop("input", {})), **rollout_fields)])
    runner = _runner(agent, store)
    assert await runner.run(max_rollouts=1, idle_exit_s=1.0) == 1
    return await store.get_rollout(queued.rollout_id)


async def test_returned_reward_succeeds_and_is_recorded_as_final_reward_span() -> None:
    store = MemoryStore()

    @rollout
    async def agent(task: dict[str, int]) -> float:
        return task["x"] / 10

    done = await _one(store, agent, input={"x": 7})
    assert done.status is RolloutStatus.SUCCEEDED
    assert done.reward == pytest.approx(0.7)
    spans = await store.query_spans(done.rollout_id)
    rewards = [s for s in spans if s.kind is SpanKind.REWARD]
    assert [(s.attributes[semconv.REWARD_VALUE], s.attributes.get(semconv.REWARD_NAME)) for s in rewards] == [
        (pytest.approx(0.7), "final")
    ]
    assert [s.kind for s in spans].count(SpanKind.AGENT) == 1


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (float("nan"), "returned nan; a reward must be a finite number"),
        (float("-inf"), "returned -inf; a reward must be a finite number"),
        ("lots", "returned str; it must return a float reward or None"),
    ],
)
async def test_an_unusable_returned_reward_fails_the_attempt(bad: Any, why: str) -> None:
    store = MemoryStore()

    @rollout
    async def agent(task: Any) -> Any:
        return bad

    done = await _one(store, agent, max_attempts=1)
    assert done.status is RolloutStatus.FAILED and done.reward is None
    [attempt] = await store.list_attempts(done.rollout_id)
    assert attempt.error is not None and f"agent agent {why}" in attempt.error


async def test_emitting_a_non_finite_reward_raises_in_the_agent() -> None:
    store = MemoryStore()

    @rollout
    def agent(task: Any) -> None:
        emit_reward(float("nan"))

    done = await _one(store, agent, max_attempts=1)
    assert done.status is RolloutStatus.FAILED
    [attempt] = await store.list_attempts(done.rollout_id)
    assert attempt.error is not None and "a reward must be a finite number, got nan" in attempt.error


async def test_emitted_reward_is_the_reward_of_an_agent_returning_none() -> None:
    store = MemoryStore()

    @rollout
    def agent(task: Any) -> None:  # sync: runs in a thread, the attempt's context goes with it
        emit_reward(0.25, name="format")
        emit_reward(0.5)

    done = await _one(store, agent)
    assert done.status is RolloutStatus.SUCCEEDED
    assert done.reward == 0.5
    spans = await store.query_spans(done.rollout_id)
    assert [s.attributes[semconv.REWARD_VALUE] for s in spans if s.kind is SpanKind.REWARD] == [0.25, 0.5]


async def test_resources_are_bound_to_the_attempt_and_pinned_versions_are_honoured() -> None:
    store = MemoryStore()
    endpoint = "http://127.0.0.1:8123"
    await store.add_resources({"llm": LLMResource(endpoint=endpoint, model="old")})
    await store.add_resources(
        {"llm": LLMResource(endpoint=endpoint, model="new"), "prompt": PromptTemplate(template="Q: {q}")}
    )
    seen: list[tuple[LLM, dict[str, Any], str]] = []

    @rollout
    async def agent(llm: LLM, resources: dict[str, Any], attempt: Any) -> float:
        seen.append((llm, resources, attempt.attempt_id))
        return 1.0

    latest = await _one(store, agent)
    pinned = await _one(store, agent, resources_version=1)
    [(llm_latest, res_latest, aid_latest), (llm_pinned, _, aid_pinned)] = seen
    assert llm_latest.model == "new" and llm_pinned.model == "old"
    assert llm_latest.base_url == f"{endpoint}/rollout/{latest.rollout_id}/attempt/{aid_latest}/v1"
    assert llm_pinned.base_url == f"{endpoint}/rollout/{pinned.rollout_id}/attempt/{aid_pinned}/v1"
    assert res_latest["prompt"] == PromptTemplate(template="Q: {q}")

    missing = await _one(store, agent, resources_version=9)
    assert missing.status is RolloutStatus.FAILED
    [attempt] = await store.list_attempts(missing.rollout_id)
    assert "resources" in (attempt.error or "")


async def test_a_raising_agent_fails_its_attempt_with_the_traceback_and_is_retried() -> None:
    store = MemoryStore()

    @rollout
    def agent(attempt: Any) -> float:
        if attempt.number == 1:
            raise RuntimeError("boom on the first try")
        return 1.0

    [queued] = await store.enqueue([Rollout(task=Task(input=None), max_attempts=3)])
    assert await _runner(agent, store).run(idle_exit_s=0.3) == 2
    done = await store.get_rollout(queued.rollout_id)
    assert (done.status, done.attempt_count, done.reward) == (RolloutStatus.SUCCEEDED, 2, 1.0)
    first, second = await store.list_attempts(done.rollout_id)
    assert first.status is AttemptStatus.FAILED and second.status is AttemptStatus.SUCCEEDED
    assert first.error is not None
    assert "Traceback" in first.error and "RuntimeError: boom on the first try" in first.error
    spans = await store.query_spans(done.rollout_id, first.attempt_id)
    assert any(s.name == "exception" for s in spans)


async def test_a_hanging_async_agent_times_out_and_the_runner_goes_on() -> None:
    store = MemoryStore()

    @rollout
    async def agent(task: str) -> float:
        if task == "hang":
            await asyncio.sleep(1000)
        return 1.0

    rollouts = [Rollout(task=Task(input="hang"), timeout_s=0.3), Rollout(task=Task(input="ok"))]
    await store.enqueue(rollouts)
    runner = _runner(agent, store)
    started = time.monotonic()
    assert await runner.run(idle_exit_s=0.3) == 2
    assert time.monotonic() - started < 5
    hung, fine = await store.list_rollouts()
    assert hung.status is RolloutStatus.TIMEOUT and fine.status is RolloutStatus.SUCCEEDED
    [attempt] = await store.list_attempts(hung.rollout_id)
    assert attempt.status is AttemptStatus.TIMEOUT and "timeout of 0.3 s" in (attempt.error or "")
    assert not runner.agent_thread_stuck  # a coroutine can be cancelled


async def test_a_sync_agent_stuck_past_its_timeout_stops_the_runner_loop() -> None:
    store = MemoryStore()

    @rollout
    def agent(task: Any) -> float:
        time.sleep(1.5)  # cannot be cancelled: the runner must say its thread is stuck
        return 1.0

    await store.enqueue([Rollout(task=Task(input=1), timeout_s=0.2), Rollout(task=Task(input=2))])
    runner = _runner(agent, store)
    assert await runner.run(idle_exit_s=0.3) == 1
    assert runner.agent_thread_stuck
    first, second = await store.list_rollouts()
    assert first.status is RolloutStatus.TIMEOUT and second.status is RolloutStatus.QUEUING


async def test_the_watchdog_ending_an_attempt_stops_the_agent() -> None:
    store = MemoryStore()
    stopped = asyncio.Event()

    @rollout
    async def agent(task: Any) -> float:
        try:
            await asyncio.sleep(1000)
        finally:
            stopped.set()
        return 1.0

    [queued] = await store.enqueue([Rollout(task=Task(input=None))])
    runner = _runner(agent, store)
    task = asyncio.create_task(runner.run(max_rollouts=1))
    while (await store.get_rollout(queued.rollout_id)).status is not RolloutStatus.RUNNING:
        await asyncio.sleep(0.01)
    await store.finish_rollout(queued.rollout_id, RolloutStatus.CANCELLED)
    assert await asyncio.wait_for(task, 5) == 1
    assert stopped.is_set()
    assert (await store.get_rollout(queued.rollout_id)).status is RolloutStatus.CANCELLED
