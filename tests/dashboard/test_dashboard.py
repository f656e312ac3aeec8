"""The live view driven through a fake run (events only: no model, no training)."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from alight.dashboard import TrainDashboard

STEPS = 5


def fake_run(dashboard: TrainDashboard) -> None:
    """The events a 5-step run sends: warm start, val at step 0, rising rewards, two errors, the end."""
    dashboard.on_start(
        {
            "run_name": "calc-grpo-test",
            "run_dir": "runs/calc-grpo-test",
            "total_steps": STEPS,
            "algorithm": "grpo",
            "model": "tiny",
            "n_runners": 4,
            "batch_size": 8,
            "group_size": 8,
            "resumed_from": None,
        }
    )
    for done in (0, 600, 1200):
        dashboard.on_stage("warm start", done, 1200, {"loss": 0.41})
    dashboard.on_step({"step": 0, "val/reward_mean": 0.1, "timing/val_s": 2.0})
    for step in range(1, STEPS + 1):
        dashboard.on_rollouts(step, {"queuing": 30, "running": 20, "succeeded": 14})
        dashboard.on_rollouts(step, {"succeeded": 60, "failed": 3, "timeout": 1})
        dashboard.on_stage("validation", 32, 64, {})
        if step == 3:
            dashboard.on_error("Traceback (most recent call last):\nValueError: calculator got 'x+'")
            dashboard.on_error("TimeoutError: attempt ran past 120 s")
        dashboard.on_step(
            {
                "step": step,
                "time_s": 12.0 * step,
                "train/reward_mean": 0.15 * step,
                "train/reward_std": 0.3,
                "val/reward_mean": 0.1 + 0.14 * step,
                "rollouts/succeeded": 60,
                "rollouts/failed": 3,
                "rollouts/timeout": 1,
                "timing/rollout_s": 8.0,
                "timing/adapt_s": 0.5,
                "timing/update_s": 3.0,
                "timing/val_s": 1.5,
                "timing/step_s": 11.6,
                "throughput/rollouts_per_s": 8.0,
                "throughput/tokens_per_s": 900.0,
                "throughput/update_tokens_per_s": 4000.0,
                "actor/loss": -0.02,
                "actor/kl": 0.0012,
                "actor/grad_norm": 0.87,
                "actor/pg_clipfrac": 0.03,
                "actor/lr": 1e-5,
                "transitions": 480,
                "weights_version": step,
            }
        )
    dashboard.on_end(
        {
            "steps": STEPS,
            "val/reward_start": 0.1,
            "val/reward_end": 0.8,
            "run_dir": "runs/calc-grpo-test",
            "png": "runs/calc-grpo-test/reward_curve.png",
            "wall_s": 61.0,
            "stopped": False,
        }
    )


def run_in(width: int, height: int = 30) -> tuple[TrainDashboard, str]:
    console = Console(file=io.StringIO(), record=True, width=width, height=height, force_terminal=True)
    with TrainDashboard(console, refresh_per_second=20) as dashboard:
        fake_run(dashboard)
    return dashboard, console.export_text()


def frame(dashboard: TrainDashboard, width: int, height: int = 30) -> list[str]:
    console = Console(file=io.StringIO(), record=True, width=width, height=height, force_terminal=True)
    console.print(dashboard)
    return console.export_text().splitlines()


def test_the_live_view_shows_the_chart_the_counter_and_the_panels() -> None:
    dashboard, live_output = run_in(100)
    assert "5/5" in live_output
    lines = frame(dashboard, 100)
    text = "\n".join(lines)
    assert len(lines) <= 30
    assert all(cell_len(line) <= 100 for line in lines)
    assert "step 5/5" in text
    assert "1.00 ┤" in text and "0.00 ┤" in text and "└┬" in text  # the chart's y and x axes
    assert any("\u2800" <= char <= "\u28ff" for char in text)  # the train curve, in braille
    assert text.count("●") >= 3  # val points
    for words in ("rollouts · step 5", "succeeded", "throughput", "step time", "actor", "grad norm"):
        assert words in text
    assert "ValueError: calculator got 'x+'" in text and "Traceback" not in text
    assert "val reward 0.100 → 0.800" in text


@pytest.mark.parametrize("width", [40, 60])
def test_narrow_terminals_get_a_stacked_view(width: int) -> None:
    dashboard, _ = run_in(width)
    lines = frame(dashboard, width)
    assert all(cell_len(line) <= width for line in lines)
    text = "\n".join(lines)
    assert "5/5" in text and "┤" in text


def test_a_short_terminal_keeps_the_header_and_the_chart() -> None:
    dashboard, _ = run_in(100, height=16)
    text = "\n".join(frame(dashboard, 100, height=16))
    assert "step 5/5" in text and "1.00 ┤" in text


def test_before_the_first_step_it_shows_each_stage_and_the_warm_start_loss_curve() -> None:
    dashboard = TrainDashboard(Console(file=io.StringIO(), width=100))
    info = {"run_name": "r", "total_steps": 10, "algorithm": "grpo", "model": "tiny", "resumed_from": None}
    dashboard.on_start({**info, "warm_start_steps": 400})
    for stage in ("building the model", "loading the model", "generating demonstrations"):
        dashboard.on_stage(stage, 0, 1, {})
    for done in range(0, 310, 10):
        dashboard.on_stage("warm start", done, 400, {"loss": 2.0 - done / 200})
    text = "\n".join(frame(dashboard, 100))
    assert "warm start" in text and "300/400 · loss 0.500" in text and "left" in text  # progress and its ETA
    assert "loss 0.500 at step 300/400" in text and "2.00 ┤" in text  # the loss curve, on its own scale
    assert any("\u2800" <= char <= "\u28ff" for char in text)
    for stage in ("building the model", "loading the model", "generating demonstrations"):
        assert stage in text  # the timeline of the stages so far
    assert "waiting for the first step" not in text


def test_a_resumed_run_names_its_checkpoint_step() -> None:
    dashboard = TrainDashboard(Console(file=io.StringIO(), width=100))
    dashboard.on_start({"run_name": "r", "total_steps": 10, "algorithm": "grpo", "model": "tiny", "resumed_from": 4})
    dashboard.on_stage("loading the model", 0, 1, {})
    text = "\n".join(frame(dashboard, 100))
    assert "grpo · tiny · resumed from step 4" in text and "loading the model" in text


def test_an_apo_run_shows_its_best_prompt() -> None:
    dashboard = TrainDashboard(Console(file=io.StringIO(), width=100))
    dashboard.on_start({"run_name": "calc_apo-test", "total_steps": 3, "algorithm": "apo"})
    for step, score in enumerate([0.25, 0.5]):
        prompt = "Use the calculator.\nThen answer." if step else "Answer."
        metrics = {"step": step, "val/reward_mean": score, "apo/best_score": score, "apo/best_round": step}
        dashboard.on_step({**metrics, "apo/best_prompt": prompt})
    lines = frame(dashboard, 100)
    text = "\n".join(lines)
    assert len(lines) <= 30 and "best prompt · score 0.500 · round 1" in text
    assert "Use the calculator." in text and "Then answer." in text


def test_an_async_run_shows_staleness_drops_importance_weights_and_runner_use() -> None:
    from alight.dashboard.panels import async_rows, throughput_panel
    from alight.dashboard.state import RunState

    latest = {
        "step": 3,
        "runners/utilisation": 0.874,
        "async/groups": 4,
        "async/staleness_0": 1,
        "async/staleness_1": 3,
        "async/staleness_mean": 0.75,
        "async/dropped_total": 2,
        "async/requeued_total": 0,
        "actor/is_weight_mean": 0.98,
        "actor/is_capped_frac": 0.012,
    }
    assert async_rows(latest) == [
        ("staleness", "0:1 1:3"),
        ("dropped", "2 · requeued 0"),
        ("IS weight", "0.980 · capped 1.2%"),
    ]
    assert async_rows({"step": 3, "runners/utilisation": 0.5}) == []  # a sync run: no async rows
    state = RunState()
    state.on_step(latest)
    console = Console(file=io.StringIO(), record=True, width=60, force_terminal=True)
    console.print(throughput_panel(state))
    text = console.export_text()
    assert "runners busy" in text and "87%" in text and "staleness" in text and "0:1 1:3" in text
