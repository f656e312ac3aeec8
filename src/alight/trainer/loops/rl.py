"""The RL loop (`algorithm.name` grpo, ppo, or sft on the agent's best rollouts): warm start, then
per step: sample tasks, enqueue `group_size` rollouts per task, wait, adapt + credit + advantages,
update, serve the new weights, validate, checkpoint.

Resuming: the newest checkpoint restores weights, optimizer, RNG and data position; metrics after
it are dropped; rollouts already enqueued for the steps after it (found by their `step` metadata)
are reused, not enqueued again, so a killed run ends with the same steps and no duplicate rollouts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.trainer.loops import LoopInput
from alight.trainer.loops.common import drive_steps, execute, start_stack, step_info
from alight.trainer.policy import Policy
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.session import RunSession
from alight.trainer.validation import Schedule, Validator

if TYPE_CHECKING:
    from alight.algorithms.lightning import LightningRL
    from alight.trainer.sampler import TaskSampler
    from alight.trainer.stack import LocalStack

logger = logging.getLogger(__name__)


class RLLoop:
    """One RL run in `run_dir` (see the module docstring); `run()` does all of it."""

    def __init__(self, run: LoopInput) -> None:
        cfg = run.cfg
        t = cfg.trainer
        self.cfg = cfg
        self.train_rows = run.train_rows
        self.total_steps = t.steps or max(1, t.epochs * len(self.train_rows) // t.batch_size)
        self.session = RunSession(cfg, run.run_dir, resume=run.resume, watchers=run.watchers)
        self.policy = Policy(cfg, self.session)
        self.policy.total_steps = self.total_steps
        self.validator = Validator(run.val_rows, cfg.data.input_field, t)

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

        step_zero = dict(self.policy.warm_start_metrics)
        await drive_steps(self.session, self.policy, stack, self.validator, schedule, step_zero, one_step)

    async def _step(self, rollouts: StepRollouts, rl: LightningRL, sampler: TaskSampler, step: int) -> dict[str, Any]:
        from alight.data import task_input

        cfg, t = self.cfg, self.cfg.trainer
        started, wall_started = time.monotonic(), time.time()
        indices = sampler.next_batch()
        tasks = [task_input(self.train_rows[i], cfg.data.input_field) for i in indices]
        ended = await rollouts.collect(step, "train", tasks, indices, t.group_size)
        rollout_s = time.monotonic() - started

        clock = time.monotonic()
        await rollouts.flush()
        succeeded = [r.rollout_id for r in ended if r.status.value == "succeeded"]
        pad_id = self.policy.pad_id
        batch, stats = (await rl.batch_from_store(rollouts.store, succeeded, pad_id)) if succeeded else (None, None)
        adapt_s = time.monotonic() - clock

        clock = time.monotonic()
        update: dict[str, float] = {}
        self.session.interrupt.updating = True  # a signal from here on lets the step end (the driver clears it)
        if batch is None:
            self.session.events.on_error(
                f"step {step}: no transitions to train on (no succeeded rollout with an LLM call)"
            )
        else:
            backend = self.policy.backend
            assert backend is not None
            if backend.colocated:  # the engine sleeps: the update takes its accelerator memory
                update = await rollouts.offloaded(lambda: backend.update(batch))
            else:
                update = await asyncio.to_thread(backend.update, batch)
            await rollouts.serve(backend.engine_weights(), step)
        update_s = time.monotonic() - clock

        summary = await rollouts.summarise(ended, "train")
        tokens = float(batch.response_lengths.sum()) if batch is not None else 0.0
        update_tokens = update.pop("actor/update_tokens", 0.0)
        metrics: dict[str, Any] = {
            "step": step,
            "epoch": round(sampler.epoch, 3),
            **summary,
            "transitions": len(batch) if batch is not None else 0,
            "response_length/mean": tokens / len(batch) if batch is not None else 0.0,
            **update,
            "runners/utilisation": await rollouts.utilisation([r.rollout_id for r in ended], wall_started, time.time()),
            "timing/rollout_s": rollout_s,
            "timing/adapt_s": adapt_s,
            "timing/update_s": update_s,
            "throughput/rollouts_per_s": len(ended) / rollout_s if rollout_s > 0 else 0.0,
            "throughput/tokens_per_s": tokens / rollout_s if rollout_s > 0 else 0.0,
            "throughput/update_tokens_per_s": update_tokens / update_s if update_s > 0 else 0.0,
            "weights_version": step if batch is not None else step - 1,
        }
        if stats is not None:
            metrics["adapter/truncated"] = stats.prompts_truncated + stats.responses_truncated
        metrics["timing/step_s"] = time.monotonic() - started
        progress = self.session.progress
        progress.step, progress.position = step, sampler.position
        return metrics
