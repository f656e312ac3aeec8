"""The RL loop of one run: warm start, then per step: sample tasks, enqueue `group_size` rollouts
per task, wait, adapt + credit + advantages, update, serve the new weights, validate, checkpoint.

Resuming: the newest checkpoint restores weights, optimizer, RNG and data position; metrics after
it are dropped; rollouts already enqueued for the steps after it (found by their `step` metadata)
are reused, not enqueued again, so a killed run ends with the same steps and no duplicate rollouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from alight.backends.base import Backend
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError, TrainingError
from alight.trainer import checkpoint as ckpt
from alight.trainer.checkpoint import seed_everything
from alight.trainer.events import Watchers
from alight.trainer.interrupt import GracefulStop
from alight.trainer.result import FitResult
from alight.trainer.run_dir import BACKEND_DIR, BASE_MODEL_DIR
from alight.trainer.sampler import demonstration_batches
from alight.trainer.threads import ThreadPolicy

logger = logging.getLogger(__name__)

LOG_FILE = "train.log"
CONFIG_FILE = "config.yaml"


class RLLoop:
    """One training run in `run_dir` (see the module docstring); `run()` does all of it."""

    updates_weights = True  # False: a loop that never updates the policy (APO), so any engine serves it

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        train_rows: list[dict[str, Any]],
        val_rows: list[dict[str, Any]] | None,
        *,
        resume: bool = False,
        watchers: Sequence[Any] = (),
    ) -> None:
        if cfg.engine.kind == "litellm" and self.updates_weights:
            raise ConfigError("engine.kind litellm serves a model alight cannot update; train with embedded or vllm")
        self.cfg = cfg
        self.run_dir = run_dir
        self.train_rows = train_rows
        self.val_rows = val_rows
        self.resume = resume
        self.events = Watchers(watchers)
        t = cfg.trainer
        self.threads = ThreadPolicy.from_config(t.torch_threads, t.torch_interop_threads, t.device)
        self.total_steps = t.steps or max(1, t.epochs * len(train_rows) // t.batch_size)
        self.step = 0  # last completed step
        self.saved_step = -1
        self.position = 0
        self.reusable: dict[tuple[str, int], list[str]] = {}
        self.started = time.monotonic()
        self.backend: Backend | None = None
        self.tokenizer: Any = None
        self.metrics_log: Any = None
        self.base_dir: Path | None = None
        self.warm_start_metrics: dict[str, float] = {}  # logged with step 0
        self.resume_state: tuple[Path, dict[str, Any], Any] | None = None  # checkpoint, its state and RNG
        self.interrupt = GracefulStop()  # SIGINT / SIGTERM: checkpoint, then stop

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> FitResult:
        from alight.models.progress import quiet_progress_bars
        from alight.trainer.metrics import MetricsLog

        self.run_dir.mkdir(parents=True, exist_ok=True)
        handler = self._log_to_file()
        stopped = False
        try:
            self.threads.apply()
            quiet_progress_bars()
            self._write_config()
            self.metrics_log = MetricsLog(
                self.run_dir,
                self.cfg.logging,
                run_name=self.run_dir.name,
                config=dataclasses.asdict(self.cfg),
                resume=self.resume,
            )
            if self.resume:
                self._resume_point()
            self._announce()
            with self.interrupt:
                try:
                    self._train(self._prepare_policy())
                except KeyboardInterrupt:
                    stopped = True
                stopped = stopped or self.interrupt.requested is not None
                if stopped:
                    self._save_on_stop()
            return self._finish(stopped)
        finally:
            if self.backend is not None:
                self.backend.close()
            logging.getLogger("alight").removeHandler(handler)
            handler.close()

    def _save_on_stop(self) -> None:
        """The checkpoint of the last completed step, unless it is written already (or step 0 of a
        run without a warm start: nothing to resume from)."""
        logger.warning("stopped at step %d", self.step)
        if self.step > self.saved_step and self.step > 0 and self.backend is not None:
            self._save()

    async def _interruptible(self, work: Coroutine[Any, Any, None]) -> None:
        """Run the asyncio part of the run; the first SIGINT/SIGTERM cancels it unless an update is
        running (then the loop stops after it); see `alight.trainer.interrupt`."""
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        assert task is not None

        def cancel() -> None:
            if not self.interrupt.updating:
                task.cancel()

        self.interrupt.arm(lambda: loop.call_soon_threadsafe(cancel))
        try:
            await work
        except asyncio.CancelledError:
            if self.interrupt.requested is None:
                raise
        finally:
            self.interrupt.arm(None)

    def _stopping(self) -> bool:
        """Whether a signal asked the run to stop (after the step that just ended)."""
        return self.interrupt.requested is not None

    def _finish(self, stopped: bool) -> FitResult:
        rows = self.metrics_log.rows()
        self.metrics_log.close()
        png = self.run_dir / "reward_curve.png"
        val = [r["val/reward_mean"] for r in rows if r.get("val/reward_mean") is not None]
        start = next((r["val/reward_mean"] for r in rows if r.get("step") == 0 and "val/reward_mean" in r), None)
        result = FitResult(
            run_dir=self.run_dir,
            steps=self.step,
            metrics=rows,
            val_reward_start=start,
            val_reward_end=val[-1] if val else None,
            stopped=stopped,
            png=png if png.is_file() else None,
            signal=self.interrupt.name,
            checkpoint=latest[1] if (latest := ckpt.latest_checkpoint(self.run_dir)) else None,
        )
        self.events.on_end(
            {
                "steps": result.steps,
                "val/reward_start": result.val_reward_start,
                "val/reward_end": result.val_reward_end,
                "run_dir": str(self.run_dir),
                "png": str(result.png) if result.png else None,
                "wall_s": round(time.monotonic() - self.started, 1),
                "stopped": stopped,
            }
        )
        return result

    def _announce(self) -> None:
        """The first event of a run, before anything slow: what runs, and a resumed run's history."""
        cfg = self.cfg
        self.events.on_start(
            {
                "run_name": self.run_dir.name,
                "run_dir": str(self.run_dir),
                "total_steps": self.total_steps,
                "algorithm": cfg.algorithm.name,
                "model": cfg.engine.model,
                "n_runners": cfg.runner.n_runners,
                "batch_size": cfg.trainer.batch_size,
                "group_size": cfg.trainer.group_size,
                "warm_start_steps": cfg.warm_start.steps if cfg.warm_start.data and not self.resume else 0,
                "resumed_from": self.step if self.resume else None,
                "history": self.metrics_log.rows() if self.resume else [],
            }
        )

    def _log_to_file(self) -> logging.Handler:
        handler = logging.FileHandler(self.run_dir / LOG_FILE)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.INFO)
        root = logging.getLogger("alight")
        root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
        return handler

    def _write_config(self) -> None:
        from omegaconf import OmegaConf

        path = self.run_dir / CONFIG_FILE
        if not (self.resume and path.exists()):
            path.write_text(OmegaConf.to_yaml(OmegaConf.structured(self.cfg)))

    # -- the policy -------------------------------------------------------------------------------
    def _base_model(self) -> Path:
        """The starting weights: the tiny model built with the run's seed, or the configured model
        (a packaged model or a GGUF file converted once, a hub model downloaded once)."""
        from alight.models.sources import prepare_model
        from alight.models.tiny import build_tiny_model, is_current_tiny_model

        model = self.cfg.engine.model
        if model == "tiny":
            path = self.run_dir / BASE_MODEL_DIR
            if not is_current_tiny_model(path):
                self.events.on_stage("building the model", 0, 1)
                build_tiny_model(path, seed=self.cfg.trainer.seed)
            return path
        return prepare_model(model, progress=lambda line: self.events.on_stage(line, 0, 1))

    def _resume_point(self) -> None:
        """Step, data position and metrics of the newest checkpoint (its weights load later)."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            raise ConfigError(f"--resume: {self.run_dir} holds no checkpoint")
        step, path = latest
        state, rng = ckpt.load_state(path)
        self.resume_state = (path, state, rng)
        self.step = self.saved_step = step
        self.position = int(state.get("position", 0))
        self.metrics_log.truncate_after(step)
        logger.info("resuming %s from step %d", self.run_dir, step)

    def _prepare_policy(self) -> Path:
        """Load the backend (from the newest checkpoint when resuming; else warm-started); returns
        the model directory the engine serves first."""
        from alight.backends.factory import make_backend
        from alight.models.chat_templates import load_tokenizer

        cfg = self.cfg
        seed_everything(cfg.trainer.seed)
        self.base_dir = self._base_model()
        self.events.on_stage("loading the model", 0, 1)
        self.tokenizer = load_tokenizer(self.base_dir, cfg.engine.chat_template)
        self.backend = make_backend(cfg, self.base_dir, work_dir=self.run_dir / BACKEND_DIR)
        if self.resume_state is not None:
            path, _, rng = self.resume_state
            self.backend.load(path)
            ckpt.restore_rng(rng)
            return path
        if cfg.warm_start.steps > 0 and cfg.warm_start.data:
            self._warm_start()
            return self._save()
        return self.base_dir

    def _warm_start(self) -> None:
        from alight.adapters.demonstrations import demonstration_transitions
        from alight.data import load_rows

        ws = self.cfg.warm_start
        assert ws.data is not None
        self.events.on_stage("generating demonstrations", 0, 1)
        rows = load_rows(ws.data, size=ws.size, seed=self.cfg.trainer.seed, generator_kwargs=ws.generator_kwargs)
        assert self.backend is not None
        max_length = ws.max_length or self.backend.max_length
        transitions, dropped = demonstration_transitions(rows, self.tokenizer, max_length=max_length, mode=ws.mode)
        if not transitions:
            raise ConfigError(f"warm_start.data {ws.data!r} yields no assistant message to learn")
        if dropped:
            logger.warning("warm start: %d demonstration messages longer than %s tokens dropped", dropped, max_length)
        logger.info(
            "warm start: %d steps on %d transitions from %d demonstrations", ws.steps, len(transitions), len(rows)
        )
        started = last = time.monotonic()
        batches = demonstration_batches(transitions, ws.batch_size, self._pad_id(), self.cfg.trainer.seed)
        self.events.on_stage("warm start", 0, ws.steps)

        def progress(step: int, loss: float) -> None:
            nonlocal last
            # Every 10 steps, and at least every second on a slow machine: the dashboard's loss curve.
            if step % 10 == 0 or step == ws.steps or time.monotonic() - last >= 1.0:
                last = time.monotonic()
                self.events.on_stage("warm start", step, ws.steps, {"loss": round(loss, 4)})
            if step % 100 == 0:
                logger.info("warm start: step %d/%d, loss %.4f", step, ws.steps, loss)

        loss = self.backend.warm_start(
            batches, steps=ws.steps, lr=ws.lr, warmup_steps=ws.warmup_steps, on_progress=progress
        )
        self.warm_start_metrics = {"warm_start/loss": loss, "timing/warm_start_s": time.monotonic() - started}
        logger.info("warm start done: loss %.4f in %.1f s", loss, self.warm_start_metrics["timing/warm_start_s"])

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id or 0)

    def _save(self) -> Path:
        assert self.base_dir is not None and self.backend is not None
        if self.step == 0:  # later checkpoints save between steps, inside the step's own time
            self.events.on_stage("saving the checkpoint", 0, 1)
        path = ckpt.save_checkpoint(
            self.run_dir,
            self.step,
            self.backend,
            {"position": self.position, "weights_version": self.step, "total_steps": self.total_steps},
            tokenizer_dir=self.base_dir,
            rng=ckpt.rng_state(),
            keep=self.cfg.trainer.keep_checkpoints,
        )
        self.saved_step = self.step
        logger.info("checkpoint %s", path)
        return path

    # -- training -------------------------------------------------------------------------------
    def _train(self, served: Path) -> None:
        from alight.trainer.stack import LocalStack

        cfg = self.cfg
        stack_cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model=str(served)))
        self.events.on_stage("starting store, engine and runners", 0, 1)
        with LocalStack(stack_cfg, self.run_dir, weights_version=self.step) as stack:
            asyncio.run(self._interruptible(self._steps(stack)))

    async def _steps(self, stack: Any) -> None:
        from alight.algorithms.lightning import LightningRL
        from alight.trainer.rollouts import StepRollouts
        from alight.trainer.sampler import TaskSampler

        cfg, t = self.cfg, self.cfg.trainer
        store = stack.trainer_store()
        try:
            rollouts = StepRollouts(store, stack, cfg, self.events)
            if self.resume:
                self.reusable = await rollouts.enqueued_after(self.step)
            rl = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=self.tokenizer)
            sampler = TaskSampler(len(self.train_rows), t.batch_size, t.seed, self.position)
            logged = {r.get("step") for r in self.metrics_log.rows()}
            if self.step == 0 and 0 not in logged:
                metrics: dict[str, Any] = {"step": 0, "weights_version": 0, **self.warm_start_metrics}
                if self.val_rows:
                    metrics.update(await self._validate(rollouts, 0))
                self._log(metrics)
            while self.step < self.total_steps and not self._stopping():
                step = self.step + 1
                try:
                    metrics = await self._train_step(rollouts, rl, sampler, step)
                    self.step, self.position = step, sampler.position
                finally:
                    self.interrupt.updating = False  # set before the update: weights and step move together
                if self.val_rows and (step == self.total_steps or (t.val_every and step % t.val_every == 0)):
                    metrics.update(await self._validate_unless_stopped(rollouts, step))
                self._log(metrics)
                if step == self.total_steps or (t.save_every and step % t.save_every == 0) or self._stopping():
                    self._save()
        finally:
            await store.close()

    async def _train_step(self, rollouts: Any, rl: Any, sampler: Any, step: int) -> dict[str, Any]:
        from alight.data import task_input

        cfg, t = self.cfg, self.cfg.trainer
        started = time.monotonic()
        indices = sampler.next_batch()
        tasks = [task_input(self.train_rows[i], cfg.data.input_field) for i in indices]
        ids = self.reusable.pop(("train", step), None)
        if ids:  # a resumed step: the rollouts a killed run enqueued, with the seeds they had
            rollouts.seed_sampling(step, "train", ids, None)
        ids = ids or await rollouts.enqueue(step, "train", tasks, indices, t.group_size)
        try:
            ended = await rollouts.wait(step, ids, t.step_timeout_s, t.min_batch_fraction)
        finally:
            rollouts.set_sampling(ids, None)
        rollout_s = time.monotonic() - started

        clock = time.monotonic()
        await rollouts.flush()
        succeeded = [r.rollout_id for r in ended if r.status.value == "succeeded"]
        batch, stats = (
            (await rl.batch_from_store(rollouts.store, succeeded, self._pad_id())) if succeeded else (None, None)
        )
        adapt_s = time.monotonic() - clock

        clock = time.monotonic()
        update: dict[str, float] = {}
        self.interrupt.updating = True  # a signal from here on lets the step end (the loop clears it)
        if batch is None:
            self.events.on_error(f"step {step}: no transitions to train on (no succeeded rollout with an LLM call)")
        else:
            backend = self.backend
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
        return metrics

    async def _validate_unless_stopped(self, rollouts: Any, step: int) -> dict[str, Any]:
        """`_validate`, skipped or cut short (no val metrics) when a signal asks the run to stop."""
        if self._stopping():
            return {}
        try:
            return await self._validate(rollouts, step)
        except asyncio.CancelledError:
            if not self._stopping():
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return {}

    async def _validate(self, rollouts: Any, step: int) -> dict[str, Any]:
        from alight.data import task_input

        assert self.val_rows is not None
        cfg, t = self.cfg, self.cfg.trainer
        started = time.monotonic()
        self.events.on_stage("validation", 0, len(self.val_rows), {})
        tasks = [task_input(row, cfg.data.input_field) for row in self.val_rows]
        ids = self.reusable.pop(("val", step), None)
        sampling = {"temperature": t.val_temperature}
        if ids:
            rollouts.seed_sampling(step, "val", ids, sampling)
        ids = ids or await rollouts.enqueue(step, "val", tasks, list(range(len(tasks))), 1, sampling=sampling)
        try:
            ended = await rollouts.wait(step, ids, t.step_timeout_s, t.min_batch_fraction, stage="validation")
        finally:
            rollouts.set_sampling(ids, None)
        summary = await rollouts.summarise(ended, "val")
        return {**summary, "timing/val_s": time.monotonic() - started}

    def _log(self, metrics: dict[str, Any]) -> None:
        metrics["time_s"] = round(time.monotonic() - self.started, 3)
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self.metrics_log.log(clean)
        self.events.on_step(clean)
        if (clean.get("step") or 0) > 0 and clean.get("rollouts/succeeded", 1) == 0:
            raise TrainingError(f"step {clean['step']}: every rollout failed; see {self.run_dir / LOG_FILE}")
