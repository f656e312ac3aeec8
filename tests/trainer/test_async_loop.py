"""The async loop through the real stack (store, proxy + embedded engine, runner processes,
LightningRL, embedded backend): `max_staleness: 0` repeats the synchronous loop's batches and
updates on a seeded run; a killed async run resumes with every step once, no group trained twice,
and the in-flight rollouts it lost counted. One fast test runs a single async step with
`max_staleness: 1` on its real feeder and backend: stale rows marked and importance-weighted."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from alight import semconv
from tests.trainer.test_fit_calc import REPO, short_config
from tests.trainer.test_seeded_runs import differences

ASYNC_ONLY = ("async/", "runners/")  # the async loop's accounting; utilisation is a clock reading


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_max_staleness_zero_repeats_the_sync_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alight.trainer import Trainer

    monkeypatch.chdir(REPO)
    sync = Trainer(short_config(tmp_path / "sync")).fit()
    asyn = Trainer(short_config(tmp_path / "async", "trainer.mode=async", "trainer.max_staleness=0")).fit()

    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if not k.startswith(ASYNC_ONLY)} for row in rows]

    assert [r["step"] for r in asyn.metrics] == [r["step"] for r in sync.metrics] == [0, 1, 2]
    assert differences(strip(sync.metrics), strip(asyn.metrics)) == []
    assert all(row.get("async/staleness_0") == row.get("async/groups") == 2 for row in asyn.metrics[1:])
    # the updates learnt something to compare: a non-trivial loss on at least one step
    assert any(row.get("actor/optimizer_steps", 0) > 0 for row in sync.metrics[1:])


STEPS, TASKS, GROUP = 5, 2, 2
OVERRIDES = [
    "warm_start.steps=0",
    f"trainer.steps={STEPS}",
    f"trainer.batch_size={TASKS}",
    f"trainer.group_size={GROUP}",
    "trainer.val_every=0",
    "trainer.save_every=1",
    "trainer.mode=async",
    "trainer.max_staleness=1",
    "data.val_size=2",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=32",
]
TRAINS = re.compile(r"step (\d+) trains groups (.*)$")


def train_command(run_dir: Path, *extra: str) -> list[str]:
    alight = [sys.executable, "-m", "alight", "train", "configs/calc.yaml", *OVERRIDES]
    return [*alight, "--no-dashboard", "--run-dir", str(run_dir), *extra]


def trained_groups(log: str) -> dict[int, list[str]]:
    """step -> the groups it trained, from the run's log (the last run that logged each step)."""
    found: dict[int, list[str]] = {}
    for line in log.splitlines():
        match = TRAINS.search(line)
        if match:
            found[int(match.group(1))] = [g.split("@")[0] for g in match.group(2).split()]
    return found


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_killed_async_run_resumes_with_no_group_trained_twice(tmp_path: Path) -> None:
    from alight.store.sqlite import SqliteStore
    from alight.types import RolloutMode, RolloutStatus

    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        train_command(run_dir), cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert first.stdout is not None
    seen: list[dict[str, Any]] = []
    try:
        for line in first.stdout:  # kill once step 2 is logged: groups of later batches are in flight
            seen.append(json.loads(line))
            if seen[-1].get("step") == 2:
                break
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert seen and seen[-1].get("step") == 2, seen
    before = trained_groups((run_dir / "train.log").read_text())

    resumed = subprocess.run(
        train_command(run_dir, "--resume"), cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    printed = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert printed[-1]["event"] == "end" and printed[-1]["steps"] == STEPS
    start = printed[0]["resumed_from"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # every step once

    after = trained_groups((run_dir / "train.log").read_text())
    lineage = [g for step in range(1, start + 1) for g in before[step]]
    lineage += [g for step in range(start + 1, STEPS + 1) for g in after[step]]
    assert len(lineage) == STEPS * TASKS and len(set(lineage)) == len(lineage), lineage  # none twice

    async def train_rollouts() -> list[Any]:
        store = SqliteStore(run_dir / "store.db")
        try:
            return await store.list_rollouts(mode=RolloutMode.TRAIN)
        finally:
            await store.close()

    train = asyncio.run(train_rollouts())
    assert all(r.status.is_terminal for r in train)
    per_group = Counter(r.metadata["group"] for r in train)
    assert all(count == GROUP for count in per_group.values()), per_group  # no group enqueued twice
    # each trained group's rollouts all ended (none cancelled); the lost in-flight ones are counted
    by_group = {g: [r for r in train if r.metadata["group"] == g] for g in lineage}
    assert all(r.status is not RolloutStatus.CANCELLED for rs in by_group.values() for r in rs)
    # the attempts in flight at the kill ran again (a second attempt), counted; every cancelled
    # rollout was outstanding at the end
    lost = rows[-1]["async/resume_in_flight_total"]
    assert lost == sum(r.attempt_count >= 2 for r in train)
    at_end = int(re.findall(r"end: cancelled (\d+) rollouts", (run_dir / "train.log").read_text())[-1])
    assert sum(r.status is RolloutStatus.CANCELLED for r in train) == at_end


@pytest.mark.usefixtures("one_torch_thread")
def test_a_step_marks_rows_served_by_older_weights_stale_and_weights_them_by_the_truncated_ratio(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_staleness: 1`, one step of the async loop on its real feeder, store and embedded
    backend: updating version 1, group t0's calls were served by version 0 and group t1's by
    version 1. The step marks t0's rows stale and not t1's; the update then weights t0's tokens by
    min(p_prox / p_behav, is_cap) (recorded 0.3 and 0.7 below the policy's: e^0.3, and e^0.7 capped
    at 1.5) and t1's by 1, though t1's recorded log-probs are as far off. Standing in: the adapter
    (transitions built here, with the rollouts' ids) and the engine (no weights served)."""
    from alight.algorithms.batch import TransitionBatch
    from alight.backends.embedded import EmbeddedBackend
    from alight.config.schema import AlgorithmConfig, ExperimentConfig
    from alight.store.memory import MemoryStore
    from alight.trainer.loops import async_rl
    from alight.types import AttemptStatus, Span, SpanKind, Transition
    from tests.backends.test_embedded_backend import on_policy_logprobs, transitions
    from tests.trainer.test_feeder import make_feeder

    backend = EmbeddedBackend(tiny_dir, AlgorithmConfig(lr=1e-3, is_cap=1.5), seed=0)
    shapes = transitions([1.0, -1.0, 0.5, -0.5])  # token ids of 4 rows (2 groups of 2)
    current = on_policy_logprobs(backend, shapes)
    offsets = [0.3, 0.7, 0.7, 0.7]  # how far below the policy's each row's recorded log-probs are
    captured: dict[str, Any] = {}

    async def adapt(rollouts: Any, rl: Any, policy: Any, ended: list[Any]) -> tuple[Any, None, float]:
        ids = [i for g in captured["groups"] for i in g.ids]
        assert sorted(r.rollout_id for r in ended) == sorted(ids)
        rows = [
            Transition.unchecked(
                s.prompt_ids,
                s.response_ids,
                1.0,
                ids[i],
                group_id="g",
                advantage=[1.0, -1.0, 0.5, -0.5][i],
                response_logprobs=[v - offsets[i] for v in current[i]],
            )
            for i, s in enumerate(shapes)
        ]
        return TransitionBatch.from_transitions(rows, 0), None, 0.0

    async def update_and_serve(rollouts: Any, session: Any, policy: Any, batch: Any, step: int) -> Any:
        captured["stale"] = None if batch.stale is None else batch.stale.tolist()
        return policy.backend.update(batch), 0.0

    monkeypatch.setattr(async_rl, "adapt", adapt)
    monkeypatch.setattr(async_rl, "update_and_serve", update_and_serve)
    cfg = ExperimentConfig()
    cfg.trainer.step_timeout_s = 10

    async def main() -> dict[str, Any]:
        store = MemoryStore()
        feeder = make_feeder(store, batch=2, group=2, staleness_=1)
        await feeder.top_up()  # two batches outstanding; the runner serves batch 1's
        for _ in range(4):
            claim = await store.dequeue("scripted")
            assert claim is not None
            group = claim.rollout.metadata["group"]
            served = {"train-b1-t0": 0, "train-b1-t1": 1}[group]
            span = Span(
                rollout_id=claim.rollout.rollout_id,
                attempt_id=claim.attempt.attempt_id,
                name="llm",
                kind=SpanKind.LLM,
                attributes={semconv.RESOURCES_VERSION: served},
            )
            await store.add_spans([span])
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        captured["groups"] = [feeder.outstanding["train-b1-t0"], feeder.outstanding["train-b1-t1"]]
        loop = async_rl.AsyncRLLoop.__new__(async_rl.AsyncRLLoop)
        loop.cfg = cfg
        loop.policy = SimpleNamespace(backend=backend)  # type: ignore[assignment]
        loop.session = SimpleNamespace(progress=SimpleNamespace(step=1, position=0, extra={}))  # type: ignore[assignment]
        return await loop._step(feeder.rollouts, feeder, None, step=2)  # type: ignore[arg-type]

    metrics = asyncio.run(main())
    assert metrics["async/staleness_1"] == 1 and metrics["async/staleness_0"] == 1
    assert captured["stale"] == [True, True, False, False]  # t0's rows (version 0), not t1's
    n = [len(s.response_ids) for s in shapes]
    weights = [math.exp(0.3), 1.5, 1.0, 1.0]  # e^0.7 = 2.01 capped; fresh rows: 1 whatever they recorded
    expected = sum(w * k for w, k in zip(weights, n, strict=True)) / sum(n)
    assert metrics["actor/is_weight_mean"] == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/is_capped_frac"] == pytest.approx(n[1] / sum(n))
