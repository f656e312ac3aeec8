"""The async loop's feeder through a real store, with a scripted runner and a scripted version
clock standing in for the engine: every LLM span carries the version that served it, the
staleness bound is never exceeded (outstanding groups and trained groups), and drops and
requeues are counted exactly. Also the utilisation measure, and `max_staleness: 0` feeding one
batch at a time as the synchronous loop does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from alight import semconv
from alight.config.schema import ExperimentConfig
from alight.errors import TrainingError
from alight.store.memory import MemoryStore
from alight.trainer.loops.feeder import Feeder, oldest_version, staleness
from alight.trainer.rollouts import StepRollouts, runner_utilisation
from alight.trainer.sampler import TaskSampler
from alight.types import AttemptStatus, Span, SpanKind

ROWS = [{"question": f"q{i}"} for i in range(50)]


class Events:
    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        pass

    def on_error(self, message: str) -> None:
        pass


def make_feeder(store: MemoryStore, *, batch: int, group: int, staleness_: int, on_stale: str = "drop") -> Feeder:
    cfg = ExperimentConfig()
    cfg.data.input_field = "question"
    proxy = SimpleNamespace(set_rollout_sampling=lambda ids, sampling: None, engine=SimpleNamespace(restarts=0))
    server = SimpleNamespace(proxy=proxy, restarts=0)
    stack = SimpleNamespace(proxy_server=server, store_server=None, pool=None, n_runners=2)
    rollouts = StepRollouts(store, stack, cfg, Events())  # type: ignore[arg-type]
    sampler = TaskSampler(len(ROWS), batch, seed=0)
    return Feeder(
        rollouts, ROWS, sampler, batch_size=batch, group_size=group, max_staleness=staleness_, on_stale=on_stale
    )


class ScriptedRunner:
    """Claims rollouts one at a time; each makes one LLM call recorded with the version the clock
    shows when it is claimed, then ends (succeeded) unless `hold(group)` keeps it running until
    the clock reaches the version it returns."""

    def __init__(self, store: MemoryStore, clock: dict[str, int], hold: Callable[[str], int] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.hold = hold or (lambda gid: 0)
        self.served: dict[str, int] = {}  # rollout id -> version of its call

    async def run(self) -> None:
        while True:
            claim = await self.store.dequeue("scripted")
            if claim is None:
                await asyncio.sleep(0.005)
                continue
            rollout, attempt = claim.rollout, claim.attempt
            version = self.clock["version"]
            self.served[rollout.rollout_id] = version
            span = Span(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt.attempt_id,
                name="llm",
                kind=SpanKind.LLM,
                attributes={semconv.RESOURCES_VERSION: version},
            )
            await self.store.add_spans([span])
            until = self.hold(rollout.metadata["group"])
            asyncio.get_running_loop().create_task(self._finish(attempt.attempt_id, until))

    async def _finish(self, attempt_id: str, until: int) -> None:
        while self.clock["version"] < until:
            await asyncio.sleep(0.005)
        await self.store.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)


async def train(feeder: Feeder, clock: dict[str, int], steps: int, runner: ScriptedRunner) -> list[Any]:
    """The async loop's schedule: take, "update" (the clock moves), top up; the bound is checked
    after every feeder call."""
    capacity = feeder.capacity
    taken = []
    await feeder.top_up()
    assert len(feeder.outstanding) <= capacity
    for _ in range(steps):
        version = clock["version"]
        groups = await feeder.take(version, timeout_s=10, min_fraction=1.0)
        assert len(groups) == feeder.batch_size
        for group in groups:
            oldest = min(runner.served[i] for i in group.ids)
            assert group.staleness == version - oldest <= feeder.max_staleness
        taken.append((version, groups))
        assert len(feeder.outstanding) <= capacity
        clock["version"] += 1
        await feeder.top_up()
        assert len(feeder.outstanding) <= capacity
    return taken


def run_scenario(staleness_: int, on_stale: str, hold: Callable[[str], int] | None, steps: int) -> tuple[Feeder, Any]:
    async def main() -> tuple[Feeder, Any]:
        store = MemoryStore()
        clock = {"version": 0}
        feeder = make_feeder(store, batch=2, group=3, staleness_=staleness_, on_stale=on_stale)
        runner = ScriptedRunner(store, clock, hold)
        worker = asyncio.create_task(runner.run())
        try:
            return feeder, await train(feeder, clock, steps, runner)
        finally:
            worker.cancel()

    return asyncio.run(main())


def test_versions_bound_and_no_drop_when_every_group_is_quick() -> None:
    feeder, taken = run_scenario(1, "drop", None, steps=5)
    assert feeder.counts.get("dropped", 0) == 0
    # two batches are fed ahead: from step 2 on, groups were served by the weights before
    assert [max(g.staleness for g in groups) for _, groups in taken] == [0, 1, 1, 1, 1]
    assert feeder.batches == 7  # 5 trained + 2 ahead: (1 + max_staleness) x batch_size groups out
    assert len(feeder.outstanding) == 4


def test_a_group_too_slow_for_the_bound_is_dropped_and_counted_once() -> None:
    # b1-t0 is held until version 2: its calls ran at version 0, staleness 2 = max_staleness + 1
    # when it completes
    feeder, taken = run_scenario(1, "drop", lambda gid: 2 if gid == "train-b1-t0" else 0, steps=5)
    assert feeder.counts["dropped"] == 1
    trained = [g.gid for _, groups in taken for g in groups]
    assert "train-b1-t0" not in trained
    assert len(trained) == len(set(trained)) == 10


def test_a_stale_group_requeued_runs_again_on_new_weights() -> None:
    feeder, taken = run_scenario(1, "requeue", lambda gid: 3 if gid == "train-b1-t0" else 0, steps=6)
    assert feeder.counts["requeued"] == 1 and feeder.counts.get("dropped", 0) == 0
    trained = {g.gid: (version, g) for version, groups in taken for g in groups}
    assert "train-b1-t0" not in trained
    _, again = trained["train-b1-t0-r1"]
    assert again.row == feeder.sampler._order(0)[0] and again.staleness <= 1


def test_max_staleness_zero_feeds_one_batch_at_a_time_and_every_group_is_fresh() -> None:
    _, taken = run_scenario(0, "drop", None, steps=4)
    assert all(g.staleness == 0 for _, groups in taken for g in groups)
    # the sync loop's batches: batch k holds the sampler's k-th draw, in order
    sampler = TaskSampler(len(ROWS), 2, seed=0)
    assert [[g.row for g in groups] for _, groups in taken] == [sampler.next_batch() for _ in range(4)]


def test_timeout_with_too_few_groups_raises_one_line() -> None:
    async def main() -> None:
        store = MemoryStore()
        feeder = make_feeder(store, batch=2, group=2, staleness_=0)
        await feeder.top_up()
        with pytest.raises(TrainingError, match="0 of 2 groups completed"):
            await feeder.take(0, timeout_s=0.3, min_fraction=0.5)

    asyncio.run(main())


def test_checkpointed_state_restores_the_feeder() -> None:
    feeder, _ = run_scenario(1, "requeue", lambda gid: 3 if gid == "train-b1-t0" else 0, steps=3)
    again = make_feeder(MemoryStore(), batch=2, group=3, staleness_=1)
    restored = Feeder(
        again.rollouts,
        ROWS,
        again.sampler,
        batch_size=2,
        group_size=3,
        max_staleness=1,
        on_stale="requeue",
        state=feeder.state(),
    )
    assert restored.state() == feeder.state()
    assert list(restored.outstanding) == list(feeder.outstanding)


def test_oldest_version_and_staleness() -> None:
    spans = [
        {"kind": "llm", "attributes": {semconv.RESOURCES_VERSION: 4}},
        {"kind": "tool", "attributes": {semconv.RESOURCES_VERSION: 1}},  # not an LLM call
        {"kind": "llm", "attributes": {semconv.RESOURCES_VERSION: 3}},
        {"kind": "llm", "attributes": {}},
    ]
    assert oldest_version(spans) == 3
    assert oldest_version([]) is None
    assert staleness(5, 3) == 2 and staleness(5, None) == 0 and staleness(2, 3) == 0


def test_runner_utilisation_clips_to_the_window() -> None:
    # 2 runners over [10, 20]: one busy 5..15 (5 s inside), one 12..30 (8 s inside): 13 of 20
    assert runner_utilisation([(5, 15), (12, 30)], 2, 10, 20) == pytest.approx(0.65)
    assert runner_utilisation([(0, 100)], 1, 10, 20) == 1.0
    assert runner_utilisation([], 4, 10, 20) == 0.0
    assert runner_utilisation([(10, 20)], 2, 20, 20) == 0.0


def test_the_feeder_never_asks_the_store_again_about_a_rollout_seen_ended() -> None:
    """Each look for complete groups (every 0.1 s) asks only about rollouts not yet seen ended: a
    complete group left outstanding (the batch was full) costs the store nothing more."""

    class CountingStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.seen_ended: set[str] = set()
            self.asked_again: list[str] = []

        async def wait_for_rollouts(self, rollout_ids: Any, timeout: float) -> Any:
            self.asked_again += [i for i in rollout_ids if i in self.seen_ended]
            ended = await super().wait_for_rollouts(rollout_ids, timeout)
            self.seen_ended.update(r.rollout_id for r in ended)
            return ended

    async def main() -> tuple[CountingStore, Any]:
        store = CountingStore()
        clock = {"version": 0}
        feeder = make_feeder(store, batch=2, group=3, staleness_=1)
        runner = ScriptedRunner(store, clock)
        worker = asyncio.create_task(runner.run())
        try:
            taken = await train(feeder, clock, 4, runner)
        finally:
            worker.cancel()
        await feeder.close()  # the run's end: the groups still outstanding are cancelled
        return store, taken

    store, taken = asyncio.run(main())
    assert len(taken) == 4 and len(store.seen_ended) >= 4 * 2 * 3
    assert store.asked_again == []
