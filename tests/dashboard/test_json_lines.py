"""The JSON-lines reporter: stdout holds exactly one JSON object per step and one at the end."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from alight.dashboard import JsonLinesReporter


def test_one_line_per_step_and_one_at_the_end() -> None:
    out, err = io.StringIO(), io.StringIO()
    reporter = JsonLinesReporter(out, err_stream=err)
    reporter.on_start({"run_name": "r", "total_steps": 3})
    reporter.on_stage("warm start", 10, 10, {"loss": 0.1})
    for step in range(3):
        reporter.on_rollouts(step, {"running": 2})
        reporter.on_step({"step": step, "train/reward_mean": 1 / 3, "actor/kl": math.nan, "actor/loss": math.inf})
    reporter.on_error("Traceback ...\nValueError: bad tool call")
    reporter.on_end({"steps": 3, "run_dir": Path("runs/r"), "stopped": False, "val/reward_end": 0.5})

    lines = out.getvalue().splitlines()
    assert len(lines) == 3 + 1
    rows = [json.loads(line) for line in lines]
    assert [row.get("step") for row in rows[:3]] == [0, 1, 2]
    assert rows[0] == {"step": 0, "train/reward_mean": 0.333333, "actor/kl": None, "actor/loss": None}
    assert rows[-1] == {"event": "end", "steps": 3, "run_dir": "runs/r", "stopped": False, "val/reward_end": 0.5}
    assert " " not in lines[0]  # compact
    assert err.getvalue() == "alight: ValueError: bad tool call\n"
