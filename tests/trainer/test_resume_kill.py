"""Kill test: SIGKILL `alight train` (trainer, store, proxy and runners: the whole process group)
mid-run, then `alight train --resume`: the run ends with every step once and no rollout twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALIGHT = [sys.executable, "-m", "alight"]
STEPS, TASKS, GROUP = 5, 2, 2
OVERRIDES = [
    "warm_start.steps=0",
    f"trainer.steps={STEPS}",
    f"trainer.batch_size={TASKS}",
    f"trainer.group_size={GROUP}",
    "trainer.val_every=0",
    "trainer.save_every=1",
    "data.val_size=2",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=32",
]


def train_command(run_dir: Path, *extra: str) -> list[str]:
    return [*ALIGHT, "train", "configs/calc.yaml", *OVERRIDES, "--no-dashboard", "--run-dir", str(run_dir), *extra]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_run_resumes_without_lost_or_repeated_steps(tmp_path: Path) -> None:
    from alight.store.sqlite import SqliteStore
    from alight.types import RolloutMode

    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        train_command(run_dir), cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert first.stdout is not None
    seen = []
    try:
        for line in first.stdout:  # JSON lines: wait for step 2, then kill inside step 3
            seen.append(json.loads(line))
            if seen[-1].get("step") == 2:
                time.sleep(0.7)
                break
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert seen and seen[-1].get("step") == 2, seen

    resumed = subprocess.run(
        train_command(run_dir, "--resume"), cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    printed = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert printed[-1]["event"] == "end" and printed[-1]["steps"] == STEPS
    assert printed[0]["event"] == "start" and printed[0]["resumed_from"] >= 2  # the last checkpoint
    assert next(row for row in printed if "event" not in row)["step"] >= 3  # resumed, not from scratch

    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(STEPS + 1))  # step 0 (validation) then every RL step, each once

    async def rollouts_per_step() -> Counter[tuple[int, int]]:
        store = SqliteStore(run_dir / "store.db")
        try:
            train = await store.list_rollouts(mode=RolloutMode.TRAIN)
            assert all(r.status.is_terminal for r in train)
            return Counter((r.metadata["step"], r.metadata["row"]) for r in train)
        finally:
            await store.close()

    per_task = asyncio.run(rollouts_per_step())
    assert sorted({step for step, _ in per_task}) == list(range(1, STEPS + 1))
    assert all(count == GROUP for count in per_task.values()), per_task  # no rollout enqueued twice
    assert sum(per_task.values()) == STEPS * TASKS * GROUP
