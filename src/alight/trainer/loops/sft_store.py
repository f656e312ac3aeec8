"""Fine-tuning from a stored run (`algorithm.name: sft` with `data.from_store`): an offline loop.

The starting policy is prepared as for RL (the tiny model or `engine.model`, then the warm start
when configured); the source store is read once, read only (`alight.trainer.sft_source`), and its
selected transitions are trained on with the backend's supervised step (negative log-likelihood
of the response tokens; every weight, or LoRA adapters with `algorithm.lora`), `algorithm.sft.batch_size`
transitions per step, for `trainer.steps` steps (default: `trainer.epochs` passes). Greedy
validation runs through the real stack (store, proxy + engine, runners on `data.val`) before the
first step, every `trainer.val_every` steps and after the last; checkpoints are written as RL
writes them, so `alight serve RUN` serves the result. The step-0 metrics hold the selection's counts.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alight.algorithms.batch import TransitionBatch
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer.loops import LoopInput, LoopKind
from alight.trainer.loops.common import Steps, drive_steps, execute, start_stack, step_info
from alight.trainer.policy import Policy
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.session import RunSession
from alight.trainer.validation import Schedule, Validator
from alight.types import Transition


class SFTStoreLoop(LoopKind):
    """One fine-tuning run in `run_dir` from the store `cfg.data.from_store` (see the module
    docstring); `train_rows` is not read (the transitions come from the store)."""

    reads_train_rows = False  # its rows are another run's stored transitions (data.from_store)

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        from alight.algorithms.sft import check_selection
        from alight.trainer.sft_source import check_source

        if cfg.algorithm.name != "sft":
            raise ConfigError(f"data.from_store is read by algorithm.name=sft only, not {cfg.algorithm.name!r}")
        if cfg.algorithm.sft.batch_size < 1:
            raise ConfigError(f"algorithm.sft.batch_size is out of range: {cfg.algorithm.sft.batch_size!r}")
        check_selection(cfg.algorithm.sft.select, cfg.algorithm.sft.splits)
        check_source(cfg.data.from_store)

    def __init__(self, run: LoopInput) -> None:
        cfg = run.cfg
        self.cfg = cfg
        self.session = RunSession(cfg, run.run_dir, resume=run.resume, watchers=run.watchers)
        self.policy = Policy(cfg, self.session)
        self.validator = Validator(run.val_rows, cfg.data.input_field, cfg.trainer)
        self.transitions: list[Transition] = []
        self.selection_metrics: dict[str, float] = {}
        self.total_steps = 0

    def run(self) -> FitResult:
        session = self.session
        with session:
            checkpoint = session.resume_point() if session.resume else None
            self._select()
            session.announce(step_info(session, self.total_steps))
            return execute(session, self.policy, lambda: self._train(checkpoint))

    def _select(self) -> None:
        """The source store's selected transitions, and the run's length from their number."""
        from alight.trainer.sft_source import read_selection

        cfg, events = self.cfg, self.session.events
        source = cfg.data.from_store
        assert source is not None
        tokenizer = self.policy.load_tokenizer()  # rebuilds the ids of calls recorded without them
        events.on_stage("reading the source store", 0, 1)
        started = time.monotonic()
        selection = read_selection(source, cfg.adapter, cfg.algorithm, tokenizer=tokenizer)
        counts = selection.counts
        if not selection.transitions:
            raise ConfigError(
                f"data.from_store {source}: no transition selected ({counts.eligible} succeeded rollouts of "
                f"{'/'.join(cfg.algorithm.sft.splits)}, {counts.transitions} transitions, none rewarded at least "
                f"algorithm.sft_min_reward={cfg.algorithm.sft_min_reward:g})"
            )
        self.transitions = selection.transitions
        self.selection_metrics = {f"sft/{k}": float(v) for k, v in counts.as_dict().items()}
        self.selection_metrics["timing/select_s"] = time.monotonic() - started
        per_epoch = math.ceil(len(self.transitions) / cfg.algorithm.sft.batch_size)
        self.total_steps = cfg.trainer.steps or max(1, cfg.trainer.epochs * per_epoch)
        self.policy.total_steps = self.total_steps
        events.on_stage("reading the source store", 1, 1, {"selected": counts.selected})

    def _train(self, checkpoint: tuple[Path, dict[str, Any], Any] | None) -> None:
        from alight.trainer.sampler import demonstration_batches

        served = self.policy.prepare(checkpoint)
        t = self.cfg.trainer
        batches = demonstration_batches(self.transitions, self.cfg.algorithm.sft.batch_size, self.policy.pad_id, t.seed)
        for _ in range(self.session.progress.step):  # a resumed run goes on with the batches it had not trained on
            next(batches)
        schedule = Schedule(t, self.total_steps)

        async def one_step(rollouts: StepRollouts, step: int) -> dict[str, Any]:
            return await self._step(rollouts, batches, schedule, step)

        steps = Steps({**self.policy.warm_start_metrics, **self.selection_metrics}, one_step)
        with start_stack(self.session, str(served), weights_version=self.session.progress.step) as stack:
            self.session.run_async(drive_steps(self.session, self.policy, stack, self.validator, schedule, steps))

    async def _step(
        self, rollouts: StepRollouts, batches: Iterator[TransitionBatch], schedule: Schedule, step: int
    ) -> dict[str, Any]:
        backend = self.policy.backend
        assert backend is not None
        progress = self.session.progress
        started = time.monotonic()
        batch = next(batches)
        self.session.interrupt.updating = True  # a signal lets this step end, then the run stops
        update = await asyncio.to_thread(backend.supervised_step, batch)
        progress.step, progress.position = step, progress.position + len(batch)
        metrics = {
            "step": step,
            "epoch": round(progress.position / len(self.transitions), 3),
            **update,
            "transitions": len(batch),
            "timing/update_s": time.monotonic() - started,
            "weights_version": step,
        }
        if self.validator and schedule.validates(step):  # validation serves the weights of this step
            await rollouts.serve(backend.engine_weights(), step)
        metrics["timing/step_s"] = time.monotonic() - started
        return metrics
