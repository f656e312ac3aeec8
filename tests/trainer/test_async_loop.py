"""The async loop through the real stack (store, proxy + embedded engine, runner processes,
LightningRL, embedded backend): `max_staleness: 0` repeats the synchronous loop's batches and
updates on a seeded run; a killed async run resumes with every step once, no group trained twice,
and the in-flight rollouts it lost counted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

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
