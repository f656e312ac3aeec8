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
from typing import Any

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
    from alight.trainer.ledger import Audit, audit, read_ledger
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

    async def rollouts_per_step() -> tuple[Counter[tuple[int, int]], Audit]:
        store = SqliteStore(run_dir / "store.db")
        try:
            train = await store.list_rollouts(mode=RolloutMode.TRAIN)
            assert all(r.status.is_terminal for r in train)
            return Counter((r.metadata["step"], r.metadata["row"]) for r in train), await audit(store, run_dir)
        finally:
            await store.close()

    per_task, found = asyncio.run(rollouts_per_step())
    # what the kept model trained on: each step once, no rollout twice, none of a kept step lost
    assert [row["step"] for row in read_ledger(run_dir)] == list(range(1, STEPS + 1))
    assert found.clean and not found.unconsumed and found.consumed > 0, found
    assert sorted({step for step, _ in per_task}) == list(range(1, STEPS + 1))
    assert all(count == GROUP for count in per_task.values()), per_task  # no rollout enqueued twice
    assert sum(per_task.values()) == STEPS * TASKS * GROUP


def run_until_step(run_dir: Path, step: int, *extra: str) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    """`alight train` started in its own session, read until it has logged `step`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        train_command(run_dir, *extra),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in process.stdout:
        seen.append(json.loads(line))
        if seen[-1].get("step") == step:
            break
    return process, seen


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_writes_a_checkpoint_and_resume_goes_on(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    from alight.trainer.checkpoint import checkpoints

    run_dir = tmp_path / "run"
    no_periodic_checkpoint = "trainer.save_every=0"  # only the last step's, and the one the signal writes
    first, _ = run_until_step(run_dir, 2, no_periodic_checkpoint)
    try:
        # inside step 3 (waiting for rollouts or updating): a step of this run takes ~0.2 s on an idle
        # machine, so a longer wait lets steps 3-5 finish first (0.7 s did, on 2 cores at rest)
        time.sleep(0.05)
        os.kill(first.pid, sig)  # the trainer only, as a process manager would
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == code, err[-3000:]
    ended = json.loads(out.splitlines()[-1])
    assert ended["event"] == "end" and ended["stopped"] is True
    saved = [step for step, _ in checkpoints(run_dir)]
    assert saved == [ended["steps"]] and ended["steps"] in (2, 3), saved  # the last completed step
    assert "--resume" in err.splitlines()[-1]  # the one line that says how to go on

    resumed = subprocess.run(
        train_command(run_dir, no_periodic_checkpoint, "--resume"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(STEPS + 1))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    first, _ = run_until_step(tmp_path / "run", 1, "trainer.save_every=0")
    try:
        os.kill(first.pid, signal.SIGINT)
        time.sleep(0.2)
        os.kill(first.pid, signal.SIGINT)
        first.wait(timeout=20)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the runners it had no time to stop
    assert first.returncode == -signal.SIGINT  # killed by the signal itself, not a clean exit
