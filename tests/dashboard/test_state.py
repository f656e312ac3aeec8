"""RunState: the run's start folded into stages with their durations, the warm-start loss curve, ETAs."""

from __future__ import annotations

import pytest

from alight.dashboard.state import RunState, Stage


def test_each_stage_ends_when_the_next_begins_and_the_warm_start_loss_is_kept() -> None:
    state = RunState()
    state.start({"total_steps": 3})
    state.on_stage("building the model", 0, 1, {})
    state.on_stage("warm start", 0, 20, {})
    for done in (10, 20):
        state.on_stage("warm start", done, 20, {"loss": 1.0 / done})
    assert state.stage is not None and (state.stage.name, state.stage.done) == ("warm start", 20)
    state.on_stage("starting store, engine and runners", 0, 1, {})
    state.on_stage("validation", 4, 4, {})
    state.on_step({"step": 0, "val/reward_mean": 0.0})
    state.on_rollouts(1, {"running": 8})
    state.on_stage("validation", 0, 4, {})  # a later validation is not part of the run's start
    state.on_step({"step": 1, "train/reward_mean": 0.5})

    names = [name for name, _ in state.stages]
    assert names == ["building the model", "warm start", "starting store, engine and runners", "validation"]
    assert all(seconds >= 0 for _, seconds in state.stages)
    assert state.warm_start == [(10, 0.1), (20, 0.05)]
    assert state.stage is None and state.step == 1


@pytest.mark.parametrize(
    ("done", "total", "now", "left"),
    [
        (100, 400, 20.0, 60.0),  # 20 s for 100 steps: 300 more take 60 s
        (0, 400, 20.0, None),  # no pace yet
        (400, 400, 20.0, None),  # done
        (0, 1, 20.0, None),  # a stage of one piece of work has no pace to go by
    ],
)
def test_a_stage_eta_follows_its_own_pace(done: int, total: int, now: float, left: float | None) -> None:
    assert Stage("warm start", done, total, {}, started=0.0).eta(now) == left
