"""Validation and the step schedule every step-based loop shares: the greedy (by default) rollouts
on the validation rows, when they run, and when a checkpoint is written."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from alight.config.schema import TrainerConfig
from alight.trainer.rollouts import StepRollouts


class Schedule:
    """When a step validates and when it checkpoints (always after the last step)."""

    def __init__(self, trainer: TrainerConfig, total_steps: int) -> None:
        self.t = trainer
        self.total_steps = total_steps

    def validates(self, step: int) -> bool:
        return step == self.total_steps or bool(self.t.val_every and step % self.t.val_every == 0)

    def saves(self, step: int) -> bool:
        return step == self.total_steps or bool(self.t.save_every and step % self.t.save_every == 0)


class Validator:
    """The validation rollouts of a run: every row of `rows` once, at `trainer.val_temperature`."""

    def __init__(self, rows: list[dict[str, Any]] | None, input_field: str | None, trainer: TrainerConfig) -> None:
        self.rows = rows
        self.input_field = input_field
        self.t = trainer

    def __bool__(self) -> bool:
        return bool(self.rows)

    async def run(self, rollouts: StepRollouts, step: int) -> dict[str, Any]:
        """Validate at `step`: val/ metrics and the time it took."""
        from alight.data import task_input

        assert self.rows is not None
        started = time.monotonic()
        rollouts.events.on_stage("validation", 0, len(self.rows), {})
        tasks = [task_input(row, self.input_field) for row in self.rows]
        sampling = {"temperature": self.t.val_temperature}
        ended = await rollouts.collect(
            step, "val", tasks, list(range(len(tasks))), 1, sampling=sampling, stage="validation"
        )
        summary = await rollouts.summarise(ended, "val")
        return {**summary, "timing/val_s": time.monotonic() - started}

    async def unless_stopped(self, rollouts: StepRollouts, step: int, stopping: Callable[[], bool]) -> dict[str, Any]:
        """`run`, skipped or cut short (no val metrics) when a signal asks the run to stop."""
        if stopping():
            return {}
        try:
            return await self.run(rollouts, step)
        except asyncio.CancelledError:
            if not stopping():
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return {}
