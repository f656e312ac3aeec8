"""One conformance suite for every Store: memory, sqlite, and the HTTP client against a real server."""

from __future__ import annotations

import asyncio
import time

import pytest

from alight.errors import InvalidRequestError, InvalidTransitionError, NotFoundError
from alight.store import ALL_ATTEMPTS, LATEST_ATTEMPT, Store
from alight.types import (
    AttemptStatus,
    LLMResource,
    PromptTemplate,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    SpanKind,
    SpanStatus,
    Task,
)

pytestmark = pytest.mark.anyio


def rollouts(n: int, **fields: object) -> list[Rollout]:
    return [Rollout(task=Task(input={"question": f"q{i}"}), **fields) for i in range(n)]  # type: ignore[arg-type]


def spans_for(rollout_id: str, attempt_id: str, n: int, **fields: object) -> list[Span]:
    return [
        Span(rollout_id=rollout_id, attempt_id=attempt_id, name=f"call-{i}", **fields)  # type: ignore[arg-type]
        for i in range(n)
    ]


async def claim_one(store: Store, worker: str = "w1"):  # type: ignore[no-untyped-def]
    claim = await store.dequeue(worker)
    assert claim is not None
    return claim


# -- queue ------------------------------------------------------------------------------------


async def test_enqueue_returns_queuing_rollouts_in_order(store: Store) -> None:
    before = time.time()
    queued = await store.enqueue(rollouts(3, mode=RolloutMode.VAL, group_id="g1"))
    assert [r.task.input["question"] for r in queued] == ["q0", "q1", "q2"]
    for r in queued:
        assert r.status is RolloutStatus.QUEUING
        assert r.attempt_count == 0
        assert r.created_at >= before - 1
        assert r.mode is RolloutMode.VAL and r.group_id == "g1"
    assert await store.get_rollout(queued[1].rollout_id) == queued[1]


async def test_enqueue_is_idempotent_by_id_and_resets_managed_fields(store: Store) -> None:
    rollout = Rollout(task=Task(input=1), status=RolloutStatus.SUCCEEDED, reward=5.0, attempt_count=7)
    first = await store.enqueue([rollout])
    assert first[0].status is RolloutStatus.QUEUING and first[0].reward is None
    assert first[0].attempt_count == 0
    again = await store.enqueue([rollout])
    assert again == first
    assert len(await store.list_rollouts()) == 1


async def test_dequeue_is_fifo_and_none_when_empty(store: Store) -> None:
    assert await store.dequeue("w") is None
    queued = await store.enqueue(rollouts(3))
    got = [(await claim_one(store)).rollout.rollout_id for _ in range(3)]
    assert got == [r.rollout_id for r in queued]
    assert await store.dequeue("w") is None


async def test_claim_creates_preparing_attempt_and_running_rollout(store: Store) -> None:
    [queued] = await store.enqueue(rollouts(1, timeout_s=30.0, heartbeat_timeout_s=5.0))
    claim = await claim_one(store, "worker-7")
    assert claim.rollout.rollout_id == queued.rollout_id
    assert claim.rollout.status is RolloutStatus.RUNNING
    assert claim.rollout.attempt_count == 1
    assert claim.rollout.started_at is not None
    attempt = claim.attempt
    assert attempt.number == 1 and attempt.status is AttemptStatus.PREPARING
    assert attempt.worker_id == "worker-7"
    assert attempt.timeout_s == 30.0 and attempt.heartbeat_timeout_s == 5.0
    assert await store.list_attempts(queued.rollout_id) == [attempt]


async def test_dequeue_with_attempt_id_is_idempotent(store: Store) -> None:
    await store.enqueue(rollouts(2))
    first = await store.dequeue("w", attempt_id="at-fixed")
    again = await store.dequeue("w", attempt_id="at-fixed")
    assert first is not None and again is not None
    assert again.attempt == first.attempt
    counts = await store.count_by_status()
    assert counts[RolloutStatus.RUNNING] == 1 and counts[RolloutStatus.QUEUING] == 1


async def test_concurrent_dequeues_never_share_an_attempt(store: Store) -> None:
    await store.enqueue(rollouts(10))
    claims = await asyncio.gather(*(store.dequeue(f"w{i}") for i in range(25)))
    got = [c for c in claims if c is not None]
    assert len(got) == 10
    assert len({c.rollout.rollout_id for c in got}) == 10
    assert len({c.attempt.attempt_id for c in got}) == 10


# -- attempts ---------------------------------------------------------------------------------


async def test_start_attempt_and_heartbeat(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    started = await store.start_attempt(claim.attempt.attempt_id)
    assert started.status is AttemptStatus.RUNNING and started.started_at is not None
    assert (await store.start_attempt(claim.attempt.attempt_id)).status is AttemptStatus.RUNNING
    await asyncio.sleep(0.01)
    beat = await store.heartbeat(claim.attempt.attempt_id)
    assert beat.last_heartbeat_at > started.last_heartbeat_at


async def test_unknown_ids_raise_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.get_rollout("ro-missing")
    with pytest.raises(NotFoundError):
        await store.start_attempt("at-missing")
    with pytest.raises(NotFoundError):
        await store.heartbeat("at-missing")
    with pytest.raises(NotFoundError):
        await store.finish_attempt("at-missing", AttemptStatus.SUCCEEDED)
    with pytest.raises(NotFoundError):
        await store.finish_rollout("ro-missing", RolloutStatus.CANCELLED)
    with pytest.raises(NotFoundError):
        await store.query_spans("ro-missing")
    with pytest.raises(NotFoundError):
        await store.list_attempts("ro-missing")
    with pytest.raises(NotFoundError):
        await store.get_resources(3)


async def test_success_finishes_rollout_with_reward(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    await store.start_attempt(claim.attempt.attempt_id)
    rollout = await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=0.75)
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 0.75
    assert rollout.ended_at is not None
    [attempt] = await store.list_attempts(rollout.rollout_id)
    assert attempt.status is AttemptStatus.SUCCEEDED and attempt.ended_at is not None
    # A retried finish with the same status is a no-op; a different one is refused.
    assert await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED) == rollout
    with pytest.raises(InvalidTransitionError):
        await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.FAILED)
    with pytest.raises(InvalidTransitionError):
        await store.start_attempt(claim.attempt.attempt_id)
    with pytest.raises(InvalidTransitionError):
        await store.heartbeat(claim.attempt.attempt_id)


async def test_finishing_as_live_status_is_invalid_request(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    with pytest.raises(InvalidRequestError):
        await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.RUNNING)
    with pytest.raises(InvalidRequestError):
        await store.finish_rollout(claim.rollout.rollout_id, RolloutStatus.QUEUING)


async def test_failure_requeues_until_max_attempts(store: Store) -> None:
    [queued] = await store.enqueue(rollouts(1, max_attempts=3))
    for number in (1, 2, 3):
        claim = await claim_one(store)
        assert claim.attempt.number == number
        rollout = await store.finish_attempt(
            claim.attempt.attempt_id, AttemptStatus.FAILED, error=f"Traceback: boom {number}"
        )
        expected = RolloutStatus.QUEUING if number < 3 else RolloutStatus.FAILED
        assert rollout.status is expected
    assert await store.dequeue("w") is None
    attempts = await store.list_attempts(queued.rollout_id)
    assert [a.number for a in attempts] == [1, 2, 3]
    assert [a.error for a in attempts] == ["Traceback: boom 1", "Traceback: boom 2", "Traceback: boom 3"]
    final = await store.get_rollout(queued.rollout_id)
    assert final.status is RolloutStatus.FAILED and final.ended_at is not None


async def test_requeued_rollout_keeps_its_place(store: Store) -> None:
    first, second = await store.enqueue(rollouts(2, max_attempts=2))
    claim = await claim_one(store)
    assert claim.rollout.rollout_id == first.rollout_id
    await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.FAILED)
    again = await claim_one(store)
    assert again.rollout.rollout_id == first.rollout_id and again.attempt.number == 2
    assert (await claim_one(store)).rollout.rollout_id == second.rollout_id


async def test_cancel_queued_and_running_rollouts(store: Store) -> None:
    queued, running = await store.enqueue(rollouts(2))
    # Claim the first, then cancel both.
    claim = await claim_one(store)
    assert claim.rollout.rollout_id == queued.rollout_id
    cancelled = await store.finish_rollout(queued.rollout_id, RolloutStatus.CANCELLED)
    assert cancelled.status is RolloutStatus.CANCELLED
    [attempt] = await store.list_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.CANCELLED
    await store.finish_rollout(running.rollout_id, RolloutStatus.CANCELLED)
    assert await store.dequeue("w") is None
    with pytest.raises(InvalidTransitionError):
        await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    with pytest.raises(InvalidTransitionError):
        await store.finish_rollout(queued.rollout_id, RolloutStatus.SUCCEEDED)


async def test_finish_rollout_sets_final_reward(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    rollout = await store.finish_rollout(claim.rollout.rollout_id, RolloutStatus.SUCCEEDED, reward=1.5)
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 1.5
    [attempt] = await store.list_attempts(rollout.rollout_id)
    assert attempt.status is AttemptStatus.SUCCEEDED
    # Same status again updates the reward only.
    again = await store.finish_rollout(rollout.rollout_id, RolloutStatus.SUCCEEDED, reward=2.0)
    assert again.reward == 2.0 and again.status is RolloutStatus.SUCCEEDED


# -- spans ------------------------------------------------------------------------------------


async def test_spans_get_sequence_ids_and_round_trip(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    attributes = {"messages": [{"role": "user", "content": "héllo ✓"}], "token_ids": [1, 2, 3], "ok": True}
    written = spans_for(rid, aid, 3, kind=SpanKind.LLM, attributes=attributes, status=SpanStatus.OK)
    assert await store.add_spans(written) == 3
    got = await store.query_spans(rid)
    assert [s.sequence_id for s in got] == [1, 2, 3]
    assert [s.name for s in got] == ["call-0", "call-1", "call-2"]
    assert got[0].attributes == attributes
    assert got[0].model_copy(update={"sequence_id": None}) == written[0]
    more = spans_for(rid, aid, 2, kind=SpanKind.TOOL)
    assert await store.add_spans(more) == 2
    assert [s.sequence_id for s in await store.query_spans(rid)] == [1, 2, 3, 4, 5]


async def test_span_writes_are_idempotent(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    batch = spans_for(claim.rollout.rollout_id, claim.attempt.attempt_id, 4)
    assert await store.add_spans(batch) == 4
    assert await store.add_spans(batch) == 0
    assert await store.add_spans(batch[1:] + spans_for(claim.rollout.rollout_id, claim.attempt.attempt_id, 1)) == 1
    got = await store.query_spans(claim.rollout.rollout_id)
    assert len(got) == 5 and len({s.span_id for s in got}) == 5


async def test_given_sequence_ids_are_kept(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    written = [Span(rollout_id=rid, attempt_id=aid, name=n, sequence_id=q) for n, q in (("b", 2), ("a", 1))]
    await store.add_spans(written)
    await store.add_spans([Span(rollout_id=rid, attempt_id=aid, name="c")])
    assert [(s.name, s.sequence_id) for s in await store.query_spans(rid)] == [("a", 1), ("b", 2), ("c", 3)]


async def test_spans_of_unknown_attempt_are_refused_whole(store: Store) -> None:
    await store.enqueue(rollouts(2))
    claim = await claim_one(store)
    other = await claim_one(store)
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    good = spans_for(rid, aid, 2)
    with pytest.raises(NotFoundError):
        await store.add_spans([*good, Span(rollout_id=rid, attempt_id="at-missing", name="x")])
    with pytest.raises(NotFoundError):  # attempt of another rollout
        await store.add_spans([*good, Span(rollout_id=rid, attempt_id=other.attempt.attempt_id, name="x")])
    assert await store.query_spans(rid) == []


async def test_query_spans_every_attempt_by_default_one_or_the_latest(store: Store) -> None:
    [queued] = await store.enqueue(rollouts(1, max_attempts=2))
    rid = queued.rollout_id
    first = await claim_one(store)
    await store.add_spans(spans_for(rid, first.attempt.attempt_id, 2))
    await store.finish_attempt(first.attempt.attempt_id, AttemptStatus.FAILED)
    second = await claim_one(store)
    await store.add_spans(spans_for(rid, second.attempt.attempt_id, 3))
    every = [first.attempt.attempt_id] * 2 + [second.attempt.attempt_id] * 3
    assert [s.attempt_id for s in await store.query_spans(rid)] == every
    assert [s.attempt_id for s in await store.query_spans(rid, ALL_ATTEMPTS)] == every
    assert [s.attempt_id for s in await store.query_spans(rid, LATEST_ATTEMPT)] == every[2:]
    assert [s.attempt_id for s in await store.query_spans(rid, first.attempt.attempt_id)] == every[:2]
    assert [s.attempt_id for s in await store.query_spans(rid, second.attempt.attempt_id)] == every[2:]
    with pytest.raises(NotFoundError):
        await store.query_spans(rid, "at-missing")


async def test_late_spans_of_a_finished_attempt_are_kept(store: Store) -> None:
    await store.enqueue(rollouts(1))
    claim = await claim_one(store)
    await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    assert await store.add_spans(spans_for(claim.rollout.rollout_id, claim.attempt.attempt_id, 1)) == 1


# -- reading ----------------------------------------------------------------------------------


async def test_list_rollouts_filters(store: Store) -> None:
    train = await store.enqueue(rollouts(4, group_id="g-train"))
    val = await store.enqueue(rollouts(2, mode=RolloutMode.VAL, group_id="g-val"))
    claim = await claim_one(store)
    await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    assert [r.rollout_id for r in await store.list_rollouts()] == [r.rollout_id for r in train + val]
    assert [r.rollout_id for r in await store.list_rollouts(mode=RolloutMode.VAL)] == [r.rollout_id for r in val]
    assert len(await store.list_rollouts(group_id="g-train")) == 4
    done = await store.list_rollouts(status=[RolloutStatus.SUCCEEDED])
    assert [r.rollout_id for r in done] == [train[0].rollout_id]
    both = await store.list_rollouts(status=[RolloutStatus.SUCCEEDED, RolloutStatus.QUEUING])
    assert len(both) == 6
    picked = await store.list_rollouts(ids=[val[1].rollout_id, train[2].rollout_id, "ro-missing"])
    assert [r.rollout_id for r in picked] == [train[2].rollout_id, val[1].rollout_id]
    page = await store.list_rollouts(limit=2, offset=3)
    assert [r.rollout_id for r in page] == [train[3].rollout_id, val[0].rollout_id]


async def test_count_by_status_lists_every_status(store: Store) -> None:
    assert await store.count_by_status() == dict.fromkeys(RolloutStatus, 0)
    await store.enqueue(rollouts(3))
    claim = await claim_one(store)
    await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.FAILED)
    await claim_one(store)
    counts = await store.count_by_status()
    assert counts[RolloutStatus.QUEUING] == 1
    assert counts[RolloutStatus.RUNNING] == 1
    assert counts[RolloutStatus.FAILED] == 1
    assert sum(counts.values()) == 3


async def test_wait_for_rollouts(store: Store) -> None:
    queued = await store.enqueue(rollouts(2))
    ids = [r.rollout_id for r in queued]
    started = time.monotonic()
    assert await store.wait_for_rollouts(ids, timeout=0.2) == []
    assert time.monotonic() - started >= 0.15

    async def finish_later() -> None:
        for _ in ids:
            claim = await claim_one(store)
            await asyncio.sleep(0.05)
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)

    started = time.monotonic()
    worker = asyncio.create_task(finish_later())
    ended = await store.wait_for_rollouts(ids, timeout=10.0)
    await worker
    assert time.monotonic() - started < 5.0
    assert sorted(r.rollout_id for r in ended) == sorted(ids)
    assert all(r.status is RolloutStatus.SUCCEEDED for r in ended)
    assert len(await store.wait_for_rollouts([*ids, "ro-missing"], timeout=0.05)) == 2


# -- resources --------------------------------------------------------------------------------


async def test_resources_are_versioned(store: Store) -> None:
    assert await store.get_latest_resources() is None
    llm = LLMResource(endpoint="http://127.0.0.1:9/v1", model="tiny", sampling_parameters={"temperature": 0.7})
    first = await store.add_resources({"llm": llm})
    second = await store.add_resources(
        {
            "llm": llm.model_copy(update={"model": "tiny-2"}),
            "prompt": PromptTemplate(template="Q: {question}"),
        }
    )
    assert (first.version, second.version) == (1, 2)
    assert await store.get_latest_resources() == second
    assert await store.get_resources(1) == first
    got = (await store.get_resources(2)).resources
    assert isinstance(got["prompt"], PromptTemplate) and got["prompt"].template == "Q: {question}"
    assert isinstance(got["llm"], LLMResource) and got["llm"].sampling_parameters == {"temperature": 0.7}


# -- watchdog ---------------------------------------------------------------------------------


async def test_watchdog_times_out_silent_attempts_and_requeues(store: Store) -> None:
    [queued] = await store.enqueue(rollouts(1, max_attempts=2, heartbeat_timeout_s=10.0))
    claim = await claim_one(store)
    await store.start_attempt(claim.attempt.attempt_id)
    assert await store.reap_timed_out(at=time.time() + 5) == []
    [reaped] = await store.reap_timed_out(at=time.time() + 11)
    assert reaped.attempt_id == claim.attempt.attempt_id and reaped.status is AttemptStatus.TIMEOUT
    assert (await store.get_rollout(queued.rollout_id)).status is RolloutStatus.QUEUING
    # The old runner learns it lost the attempt.
    with pytest.raises(InvalidTransitionError):
        await store.heartbeat(claim.attempt.attempt_id)
    with pytest.raises(InvalidTransitionError):
        await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    second = await claim_one(store)
    assert second.attempt.number == 2
    [reaped] = await store.reap_timed_out(at=time.time() + 11)
    final = await store.get_rollout(queued.rollout_id)
    assert final.status is RolloutStatus.TIMEOUT and final.ended_at is not None


async def test_watchdog_enforces_attempt_time_limit(store: Store) -> None:
    [queued] = await store.enqueue(rollouts(1, timeout_s=30.0, heartbeat_timeout_s=None))
    claim = await claim_one(store)
    await store.start_attempt(claim.attempt.attempt_id)
    await store.heartbeat(claim.attempt.attempt_id)
    assert await store.reap_timed_out(at=time.time() + 20) == []
    assert len(await store.reap_timed_out(at=time.time() + 31)) == 1
    assert (await store.get_rollout(queued.rollout_id)).status is RolloutStatus.TIMEOUT
    [attempt] = await store.list_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.TIMEOUT


async def test_ids_that_cannot_travel_in_a_url_are_refused(store: Store) -> None:
    from pydantic import ValidationError

    for bad in ("ro/1", "ro 1", ""):
        with pytest.raises(ValidationError):
            Rollout(rollout_id=bad, task=Task(input=1))
    await store.enqueue(rollouts(1))
    with pytest.raises(InvalidRequestError):
        await store.dequeue("w", attempt_id="at/1")
    assert (await store.count_by_status())[RolloutStatus.QUEUING] == 1
