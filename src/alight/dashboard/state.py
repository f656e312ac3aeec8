"""What the live view knows about a run: the training events folded into one plain object."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Rollout statuses in the order the view shows them.
ROLLOUT_STATUSES = ("queuing", "running", "succeeded", "failed", "timeout", "cancelled")
#: The stage whose `loss` the view draws until the first RL step.
WARM_START = "warm start"


@dataclass
class Stage:
    """Progress of work outside a step (building the model, warm start, starting runners, validation)."""

    name: str
    done: int
    total: int
    info: dict[str, Any]
    started: float  # time.monotonic() of its first event

    def eta(self, now: float) -> float | None:
        """Seconds left at this stage's pace so far; None before its first unit of work is done."""
        if self.total <= 1 or self.done <= 0 or self.done >= self.total:
            return None
        return (now - self.started) / self.done * (self.total - self.done)


@dataclass
class RunState:
    """The training events of one run, folded; `TrainDashboard` renders it."""

    info: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    step: int | None = None
    latest: dict[str, Any] = field(default_factory=dict)  # the last step's metrics
    train: list[tuple[int, float]] = field(default_factory=list)  # (step, train/reward_mean)
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, val/reward_mean)
    throughput: deque[float] = field(default_factory=lambda: deque(maxlen=60))  # rollouts/s per step
    rollouts_step: int | None = None
    rollouts: dict[str, int] = field(default_factory=dict)
    stage: Stage | None = None
    stages: list[tuple[str, float]] = field(default_factory=list)  # (name, seconds) of the stages that ended
    warm_start: list[tuple[int, float]] = field(default_factory=list)  # (warm-start step, loss)
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    n_errors: int = 0
    step_ends: deque[float] = field(default_factory=lambda: deque(maxlen=6))  # monotonic end times
    summary: dict[str, Any] | None = None
    chart_cache: tuple[tuple[int, ...], list[str]] | None = None  # (its key, the chart's lines)

    @property
    def total_steps(self) -> int | None:
        total = self.info.get("total_steps")
        return int(total) if isinstance(total, int | float) else None

    def start(self, info: dict[str, Any]) -> None:
        self.info = dict(info)
        self.started = time.monotonic()
        for metrics in info.get("history") or ():  # optional: earlier steps of a resumed run
            self._fold(metrics)

    def on_stage(self, name: str, done: int, total: int, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if self.stage is None or self.stage.name != name:
            self._end_stage(now)
            self.stage = Stage(name, done, total, dict(info), now)
        else:
            self.stage.done, self.stage.total, self.stage.info = done, total, dict(info)
        loss = number(info.get("loss"))
        if name == WARM_START and loss is not None and done > 0:
            self.warm_start.append((done, loss))

    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        self._end_stage(time.monotonic())  # a step's rollouts run: the stages before it ended
        self.rollouts_step, self.rollouts = step, dict(counts)

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._fold(metrics)
        self.step_ends.append(time.monotonic())
        self._end_stage(self.step_ends[-1])  # warm start and validation end before the step they belong to

    def _end_stage(self, now: float) -> None:
        if self.stage is not None:
            if (self.step or 0) < 1:  # the timeline of the run's start; later stages are validations
                self.stages.append((self.stage.name, now - self.stage.started))
            self.stage = None

    def on_error(self, message: str) -> None:
        self.n_errors += 1
        lines = message.strip().splitlines()
        self.errors.append(lines[-1] if lines else "(empty error)")

    def on_end(self, summary: dict[str, Any]) -> None:
        self.summary = dict(summary)

    def _fold(self, metrics: dict[str, Any]) -> None:
        step = int(metrics.get("step", (self.step or 0) + 1))
        self.step, self.latest = step, dict(metrics)
        for key, points in (("train/reward_mean", self.train), ("val/reward_mean", self.val)):
            value = number(metrics.get(key))
            if value is not None:
                points.append((step, value))
        rate = number(metrics.get("throughput/rollouts_per_s"))
        if rate is not None:
            self.throughput.append(rate)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def eta(self) -> float | None:
        """Seconds left at the pace of the last few steps; None before two steps ended."""
        total, step = self.total_steps, self.step
        if total is None or step is None or len(self.step_ends) < 2:
            return None
        pace = (self.step_ends[-1] - self.step_ends[0]) / (len(self.step_ends) - 1)
        return max(0.0, (total - step) * pace - (time.monotonic() - self.step_ends[-1]))


def number(value: Any) -> float | None:
    """`value` as a finite float, or None (missing, NaN, infinite, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
