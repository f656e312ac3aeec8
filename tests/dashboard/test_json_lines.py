"""The JSON-lines reporter: stdout holds only JSON objects: the start, the stages, one per step, the end."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from alight.dashboard import JsonLinesReporter, json_lines


def test_a_line_for_the_start_each_stage_each_step_and_the_end() -> None:
    out, err = io.StringIO(), io.StringIO()
    reporter = JsonLinesReporter(out, err_stream=err)
    reporter.on_start({"run_name": "r", "total_steps": 3, "history": [{"step": 0}]})
    reporter.on_stage("warm start", 10, 10, {"loss": 0.1})
    for step in range(3):
        reporter.on_rollouts(step, {"running": 2})
        reporter.on_step({"step": step, "train/reward_mean": 1 / 3, "actor/kl": math.nan, "actor/loss": math.inf})
    reporter.on_error("Traceback ...\nValueError: bad tool call")
    reporter.on_end({"steps": 3, "run_dir": Path("runs/r"), "stopped": False, "val/reward_end": 0.5})

    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 1 + 3 + 1
    rows = [json.loads(line) for line in lines]
    assert rows[0] == {"event": "start", "run_name": "r", "total_steps": 3}  # a resumed run's history stays out
    stage = rows[1]
    assert stage.pop("elapsed_s") >= 0
    assert stage == {"event": "stage", "stage": "warm start", "done": 10, "total": 10, "loss": 0.1}
    steps = [row for row in rows if "event" not in row]
    assert [row["step"] for row in steps] == [0, 1, 2]
    assert steps[0] == {"step": 0, "train/reward_mean": 0.333333, "actor/kl": None, "actor/loss": None}
    assert rows[-1] == {"event": "end", "steps": 3, "run_dir": "runs/r", "stopped": False, "val/reward_end": 0.5}
    assert " " not in lines[2]  # compact
    assert err.getvalue() == "alight: ValueError: bad tool call\n"


def test_a_stage_writes_when_it_begins_and_ends_and_at_most_every_few_seconds_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0.0]
    monkeypatch.setattr(json_lines.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    reporter = JsonLinesReporter(out, stage_every_s=5.0)
    reporter.on_start({"run_name": "r"})
    reporter.on_stage("building the model", 0, 1, {})
    for done in range(0, 401, 10):  # a warm start of 400 steps, 10 steps a second
        clock[0] = 1.0 + done / 10
        reporter.on_stage("warm start", done, 400, {"loss": 1.0})
    clock[0] = 50.0
    reporter.on_stage("validation", 0, 4, {})

    rows = [json.loads(line) for line in out.getvalue().splitlines()][1:]
    stages = [(row["stage"], row["done"], row["elapsed_s"]) for row in rows]
    assert stages[0] == ("building the model", 0, 0.0)
    warm = [(done, at) for name, done, at in stages if name == "warm start"]
    assert [at for _, at in warm] == [1.0 + 5 * k for k in range(9)]  # its start, every 5 s, its end
    assert warm[0][0] == 0 and warm[-1][0] == 400
    assert stages[-1] == ("validation", 0, 50.0)
