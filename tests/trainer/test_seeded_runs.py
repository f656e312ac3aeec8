"""The shortened calc training twice with the same seed, through the real stack: once through the
Python API, once through `alight train --no-dashboard` in a subprocess. Both repeat each other step
for step (rewards, sampled lengths, the warm start's loss exactly; the update's loss and statistics
to rounding; no timing), as README claims; on the way, the API run's
dashboard shows the stages of the run's start and the warm-start loss before the first RL step,
and the command's output holds JSON lines only, no third-party progress bar."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from alight.dashboard import TrainDashboard
from tests.trainer.test_fit_calc import CALC, REPO, SHORT, short_config

#: What a bar of tqdm (transformers' `Loading weights`, `Writing model shards`) or pip looks like.
PROGRESS_BAR_MARKS = ("Loading weights", "Writing model shards", "%|", "it/s]", "s/it]")
STARTING_RUNNERS = "starting store, engine and runners"


class FirstStepView(TrainDashboard):
    """The live dashboard fed the run's events (not drawn on a terminal); it keeps the frame it
    would draw when the runners start: after the warm start, before any RL step."""

    def __init__(self) -> None:
        super().__init__(Console(file=io.StringIO()))
        self.frame: str | None = None

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        super().on_stage(stage, done, total, info)
        if stage == STARTING_RUNNERS and self.frame is None:
            console = Console(file=io.StringIO(), record=True, width=120, height=40, force_terminal=True)
            console.print(self)
            self.frame = console.export_text()


def same(key: str, a: Any, b: Any) -> bool:
    """Equal, to the last digit; the update's metrics to 1e-4 (1e-6 near 0): the engine's recorded
    log-probs, their starting point, depend in the last bits on which concurrent calls it happened
    to batch together (padding changes the shapes of the sums), though every sampled token is the same."""
    if key.startswith("actor/") and isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
    return bool(a == b)


def differences(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[tuple[Any, str, Any, Any]]:
    """(step, metric, first value, second value) wherever two runs' metrics differ, timings left out."""
    found = []
    for a, b in zip(first, second, strict=True):
        for key in sorted(set(a) | set(b)):
            clocked = key.startswith(("timing/", "throughput/", "runners/")) or key == "time_s"
            if not clocked and not same(key, a.get(key), b.get(key)):
                found.append((a.get("step"), key, a.get(key), b.get(key)))
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_same_seed_repeats_every_reward_and_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alight.trainer import Trainer

    monkeypatch.chdir(REPO)
    view = FirstStepView()
    api = Trainer(short_config(tmp_path / "api"), watchers=[view]).fit()

    run_dir = tmp_path / "cli-run"
    command = [sys.executable, "-m", "alight", "train", str(CALC), *SHORT, f"trainer.output_dir={tmp_path / 'cli'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, "--run-dir", str(run_dir), "--no-dashboard"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr

    cli_metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert differences(api.metrics, cli_metrics) == []
    assert [m["step"] for m in api.metrics] == [0, 1, 2]
    assert all("train/reward_mean" in m and "actor/loss" in m for m in api.metrics[1:])

    # The dashboard, before the first RL step: each stage so far and the warm start's loss curve.
    assert view.frame is not None
    assert "at step 20/20" in view.frame  # the loss curve's subtitle: the last of warm_start.steps=20
    for shown in ("building the model", "generating demonstrations", "warm start", STARTING_RUNNERS):
        assert shown in view.frame, (shown, view.frame)
    assert "waiting for the first step" not in view.frame

    # The command's stdout: JSON lines only (start, stages, steps, end); no progress bar anywhere.
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    stages = [row["stage"] for row in rows if row.get("event") == "stage"]
    assert rows[0]["event"] == "start" and rows[-1]["event"] == "end"
    assert stages[:3] == ["building the model", "loading the model", "generating demonstrations"]
    assert "warm start" in stages and STARTING_RUNNERS in stages
    assert [row["step"] for row in rows if "step" in row] == [0, 1, 2]
    for mark in PROGRESS_BAR_MARKS:
        assert mark not in done.stdout + done.stderr, (mark, done.stderr)
