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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer.loop import RLLoop
from alight.types import Transition


class SFTLoop(RLLoop):
    """One fine-tuning run in `run_dir` from the store `cfg.data.from_store` (see the module docstring)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        val_rows: list[dict[str, Any]] | None,
        *,
        resume: bool = False,
        watchers: Sequence[Any] = (),
    ) -> None:
        if cfg.algorithm.name != "sft":
            raise ConfigError(f"data.from_store fine-tunes with algorithm.name=sft, not {cfg.algorithm.name!r}")
        if cfg.algorithm.sft.batch_size < 1:
            raise ConfigError(f"algorithm.sft.batch_size is out of range: {cfg.algorithm.sft.batch_size!r}")
        super().__init__(cfg, run_dir, [], val_rows, resume=resume, watchers=watchers)
        self.transitions: list[Transition] = []
        self.selection_metrics: dict[str, float] = {}

    # -- the selection, before the run announces its length ----------------------------------------
    def _announce(self) -> None:
        self._select()
        super()._announce()

    def _select(self) -> None:
        from alight.models.chat_templates import load_tokenizer
        from alight.trainer.sft_source import read_selection

        cfg = self.cfg
        source = cfg.data.from_store
        assert source is not None
        # rebuilds the ids of calls recorded without them
        tokenizer = load_tokenizer(self._base_model(), cfg.engine.chat_template)
        self.events.on_stage("reading the source store", 0, 1)
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
        self.events.on_stage("reading the source store", 1, 1, {"selected": counts.selected})

    # -- training -------------------------------------------------------------------------------
    async def _steps(self, stack: Any) -> None:
        from alight.trainer.rollouts import StepRollouts
        from alight.trainer.sampler import demonstration_batches

        cfg, t = self.cfg, self.cfg.trainer
        backend: Any = self.backend
        step_fn = getattr(backend, "supervised_step", None)
        if step_fn is None:
            raise ConfigError(f"trainer.backend={t.backend} cannot fine-tune from a store; use embedded")
        store = stack.trainer_store()
        try:
            rollouts = StepRollouts(store, stack, cfg, self.events)
            if self.resume:
                self.reusable = await rollouts.enqueued_after(self.step)
            logged = {r.get("step") for r in self.metrics_log.rows()}
            if self.step == 0 and 0 not in logged:
                metrics: dict[str, Any] = {
                    "step": 0,
                    "weights_version": 0,
                    **self.warm_start_metrics,
                    **self.selection_metrics,
                }
                if self.val_rows:
                    metrics.update(await self._validate(rollouts, 0))
                self._log(metrics)
            size = self.cfg.algorithm.sft.batch_size
            batches = demonstration_batches(self.transitions, size, self._pad_id(), t.seed)
            for _ in range(self.step):  # a resumed run goes on with the batches it had not trained on
                next(batches)
            while self.step < self.total_steps and not self._stopping():
                step = self.step + 1
                started = time.monotonic()
                batch = next(batches)
                self.interrupt.updating = True  # a signal lets this step end, then the run stops
                try:
                    update = await asyncio.to_thread(step_fn, batch)
                    self.step, self.position = step, self.position + len(batch)
                finally:
                    self.interrupt.updating = False
                metrics = {
                    "step": step,
                    "epoch": round(self.position / len(self.transitions), 3),
                    **update,
                    "transitions": len(batch),
                    "timing/update_s": time.monotonic() - started,
                    "weights_version": step,
                }
                if self.val_rows and (step == self.total_steps or (t.val_every and step % t.val_every == 0)):
                    await rollouts.serve(backend.engine_weights(), step)
                    metrics.update(await self._validate_unless_stopped(rollouts, step))
                metrics["timing/step_s"] = time.monotonic() - started
                self._log(metrics)
                if step == self.total_steps or (t.save_every and step % t.save_every == 0) or self._stopping():
                    self._save()
        finally:
            await store.close()
