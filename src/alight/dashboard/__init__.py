"""What a training run shows: the live terminal view and the JSON-lines reporter.

Both take the same events from the trainer (duck-typed): `on_start(info)`,
`on_stage(stage, done, total, info)`, `on_rollouts(step, counts)`, `on_step(metrics)`,
`on_error(message)` and `on_end(summary)`.
"""

from __future__ import annotations

from alight.dashboard.chart import render_chart
from alight.dashboard.json_lines import JsonLinesReporter
from alight.dashboard.live import TrainDashboard

__all__ = ["JsonLinesReporter", "TrainDashboard", "render_chart"]
