"""The RL loop (`algorithm.name` grpo, ppo, or sft on the agent's best rollouts): warm start, then
per step: sample tasks, enqueue `group_size` rollouts per task, wait, adapt + credit + advantages,
update, serve the new weights, validate, checkpoint.

Resuming: the newest checkpoint restores weights, optimizer, RNG and data position; metrics after
it are dropped; rollouts already enqueued for the steps after it (found by their `step` metadata)
are reused, not enqueued again, so a killed run ends with the same steps and no duplicate rollouts.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.trainer.loops import LoopInput, LoopKind
from alight.trainer.loops.common import (
    Steps,
    adapt,
    drive_steps,
    execute,
    rl_parts,
    start_stack,
    step_info,
    train_metrics,
    update_and_serve,
)
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.validation import Schedule

if TYPE_CHECKING:
    from alight.algorithms.lightning import LightningRL
    from alight.trainer.sampler import TaskSampler
    from alight.trainer.stack import LocalStack

logger = logging.getLogger(__name__)


class RLLoop(LoopKind):
    """One RL run in `run_dir` (see the module docstring); `run()` does all of it."""

    def __init__(self, run: LoopInput) -> None:
        self.cfg = run.cfg
        self.train_rows = run.train_rows
        self.session, self.policy, self.validator, self.total_steps = rl_parts(run)

    def run(self) -> FitResult:
        session = self.session
        with session:
            checkpoint = session.resume_point() if session.resume else None
            session.announce(step_info(session, self.total_steps))
            return execute(session, self.policy, lambda: self._train(checkpoint))

    def _train(self, checkpoint: tuple[Path, dict[str, Any], Any] | None) -> None:
        served = self.policy.prepare(checkpoint)
        with start_stack(self.session, str(served), weights_version=self.session.progress.step) as stack:
            schedule = Schedule(self.cfg.trainer, self.total_steps)
            self.session.run_async(self._steps(stack, schedule))

    async def _steps(self, stack: LocalStack, schedule: Schedule) -> None:
        from alight.algorithms.lightning import LightningRL
        from alight.trainer.sampler import TaskSampler

        cfg, t = self.cfg, self.cfg.trainer
        rl = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=self.policy.tokenizer)
        sampler = TaskSampler(len(self.train_rows), t.batch_size, t.seed, self.session.progress.position)

        async def one_step(rollouts: StepRollouts, step: int) -> dict[str, Any]:
            return await self._step(rollouts, rl, sampler, step)

        steps = Steps(dict(self.policy.warm_start_metrics), one_step)
        await drive_steps(self.session, self.policy, stack, self.validator, schedule, steps)

    async def _step(self, rollouts: StepRollouts, rl: LightningRL, sampler: TaskSampler, step: int) -> dict[str, Any]:
        from alight.data import task_input

        cfg, t = self.cfg, self.cfg.trainer
        started, wall_started = time.monotonic(), time.time()
        indices = sampler.next_batch()
        tasks = [task_input(self.train_rows[i], cfg.data.input_field) for i in indices]
        ended = await rollouts.collect(step, "train", tasks, indices, t.group_size)
        rollout_s = time.monotonic() - started

        batch, stats, adapt_s = await adapt(rollouts, rl, self.policy, ended)

        update, update_s = await update_and_serve(rollouts, self.session, self.policy, batch, step)
        timings = {"rollout_s": rollout_s, "adapt_s": adapt_s, "update_s": update_s, "generation_s": rollout_s}
        ids = [r.rollout_id for r in ended]
        metrics = await train_metrics(rollouts, step, ended, batch, update, timings, busy=ids, since=wall_started)
        metrics["epoch"] = round(sampler.epoch, 3)
        if stats is not None:
            metrics["adapter/truncated"] = stats.prompts_truncated + stats.responses_truncated
        metrics["timing/step_s"] = time.monotonic() - started
        progress = self.session.progress
        progress.step, progress.position = step, sampler.position
        return metrics
