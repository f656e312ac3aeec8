"""Model-based test: random operation sequences give the same outcome on the memory and SQLite stores.

The conformance suite checks hand-picked scenarios; this drives both stores with the same random
sequences (enqueue, claim, start, heartbeat, finish, cancel, spans, watchdog) and requires the same
answers, the same error classes and the same final state.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from alight.errors import AlightError
from alight.store import ALL_ATTEMPTS, MemoryStore, Store
from alight.store.sqlite import SqliteStore
from alight.types import Attempt, AttemptStatus, Rollout, RolloutStatus, Span, Task

FINISHES = [AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.CANCELLED]
ROLLOUT_ENDS = [RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED]


def rollout_view(rollout: Rollout) -> tuple[Any, ...]:
    return (rollout.rollout_id, rollout.status, rollout.attempt_count, rollout.reward)


def attempt_view(attempt: Attempt) -> tuple[Any, ...]:
    return (attempt.attempt_id, attempt.rollout_id, attempt.number, attempt.status, attempt.error)


def outcome(value: Any) -> Any:
    """What is compared between the stores: views of records, or the error class."""
    if isinstance(value, AlightError):
        return type(value)
    if isinstance(value, Rollout):
        return rollout_view(value)
    if isinstance(value, Attempt):
        return attempt_view(value)
    if value is not None and hasattr(value, "rollout") and hasattr(value, "attempt"):
        return (rollout_view(value.rollout), attempt_view(value.attempt))
    if isinstance(value, list):
        return [outcome(v) for v in value]
    return value


class SameBehaviour(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.TemporaryDirectory()
        self.stores: list[Store] = []
        self.rollout_ids: list[str] = []
        self.attempt_ids: list[str] = []
        self.counter = 0
        self.clock = time.time()

    @initialize()
    def open_stores(self) -> None:
        self.stores = [MemoryStore(), SqliteStore(Path(self.folder.name) / "store.db")]

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        results = []
        for store in self.stores:
            try:
                results.append(self.loop.run_until_complete(getattr(store, method)(*args, **kwargs)))
            except AlightError as err:
                results.append(err)
        first, second = (outcome(r) for r in results)
        assert first == second, f"{method}{args}{kwargs}: memory {first!r} != sqlite {second!r}"
        return results[0]

    def next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    @rule(n=st.integers(1, 3), max_attempts=st.integers(1, 3))
    def enqueue(self, n: int, max_attempts: int) -> None:
        batch = [
            Rollout(
                rollout_id=self.next_id("ro"), task=Task(input=i), max_attempts=max_attempts, heartbeat_timeout_s=10
            )
            for i in range(n)
        ]
        self.both("enqueue", batch)
        self.rollout_ids += [r.rollout_id for r in batch]

    @rule()
    def dequeue(self) -> None:
        attempt_id = self.next_id("at")
        claim = self.both("dequeue", "w", attempt_id=attempt_id)
        if claim is not None:
            self.attempt_ids.append(attempt_id)

    @precondition(lambda self: self.attempt_ids)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.both("start_attempt", data.draw(st.sampled_from(self.attempt_ids)))

    @precondition(lambda self: self.attempt_ids)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        self.both("heartbeat", data.draw(st.sampled_from(self.attempt_ids)))

    @precondition(lambda self: self.attempt_ids)
    @rule(data=st.data(), status=st.sampled_from(FINISHES), reward=st.sampled_from([None, 0.0, 1.0]))
    def finish_attempt(self, data: st.DataObject, status: AttemptStatus, reward: float | None) -> None:
        self.both("finish_attempt", data.draw(st.sampled_from(self.attempt_ids)), status, reward=reward)

    @precondition(lambda self: self.rollout_ids)
    @rule(data=st.data(), status=st.sampled_from(ROLLOUT_ENDS), reward=st.sampled_from([None, 0.5]))
    def finish_rollout(self, data: st.DataObject, status: RolloutStatus, reward: float | None) -> None:
        self.both("finish_rollout", data.draw(st.sampled_from(self.rollout_ids)), status, reward=reward)

    @precondition(lambda self: self.attempt_ids)
    @rule(data=st.data(), n=st.integers(1, 3), repeat=st.booleans())
    def add_spans(self, data: st.DataObject, n: int, repeat: bool) -> None:
        attempt_id = data.draw(st.sampled_from(self.attempt_ids))
        [attempt] = [
            a
            for rid in self.rollout_ids
            for a in self.loop.run_until_complete(self.stores[0].list_attempts(rid))
            if a.attempt_id == attempt_id
        ]
        spans = [
            Span(rollout_id=attempt.rollout_id, attempt_id=attempt_id, span_id=self.next_id("sp"), name="s")
            for _ in range(n)
        ]
        self.both("add_spans", spans)
        if repeat:
            self.both("add_spans", spans)

    @rule(seconds=st.sampled_from([0, 5, 11]))
    def watchdog(self, seconds: int) -> None:
        reaped = self.both("reap_timed_out", at=time.time() + seconds)
        assert all(a.status is AttemptStatus.TIMEOUT for a in reaped)

    @invariant()
    def same_state(self) -> None:
        if not self.stores:
            return
        self.both("count_by_status")
        for rollout_id in self.rollout_ids:
            self.both("get_rollout", rollout_id)
            views = []
            for store in self.stores:
                attempts = self.loop.run_until_complete(store.list_attempts(rollout_id))
                spans = self.loop.run_until_complete(store.query_spans(rollout_id, ALL_ATTEMPTS))
                views.append(([attempt_view(a) for a in attempts], [(s.span_id, s.sequence_id) for s in spans]))
            assert views[0] == views[1], rollout_id

    def teardown(self) -> None:
        for store in self.stores:
            self.loop.run_until_complete(store.close())
        self.loop.close()
        self.folder.cleanup()


SameBehaviour.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestMemoryAndSqliteBehaveTheSame = SameBehaviour.TestCase
