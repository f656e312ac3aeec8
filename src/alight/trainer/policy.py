"""The policy of a run: its starting weights, its tokenizer, the backend that trains it, the
supervised warm start, and its checkpoints.

    policy = Policy(cfg, session)
    served = policy.prepare(resume=checkpoint_or_None)   # the model directory the engine serves first
    ...policy.backend.update(batch)...; policy.save()
    policy.close()
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from alight.backends.base import Backend
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer import checkpoint as ckpt
from alight.trainer.run_dir import BACKEND_DIR, BASE_MODEL_DIR
from alight.trainer.sampler import demonstration_batches
from alight.trainer.session import RunSession

logger = logging.getLogger(__name__)


class Policy:
    """The run's trainable policy (see the module docstring); `backend` is None until `prepare`."""

    def __init__(self, cfg: ExperimentConfig, session: RunSession) -> None:
        self.cfg = cfg
        self.session = session
        self.events = session.events
        self.backend: Backend | None = None
        self.tokenizer: Any = None
        self.base_dir: Path | None = None
        self.total_steps = 0  # recorded in checkpoints
        self.warm_start_metrics: dict[str, float] = {}  # logged with step 0

    # -- the starting weights ---------------------------------------------------------------------
    def base_model(self) -> Path:
        """The starting weights: the tiny model built with the run's seed, or the configured model
        (a packaged model or a GGUF file converted once, a hub model downloaded once)."""
        from alight.models.resolve import resolve_model

        if self.base_dir is None:
            self.base_dir = resolve_model(
                self.cfg.engine.model,
                tiny_dir=self.session.run_dir / BASE_MODEL_DIR,  # built with the run's seed, kept with the run
                seed=self.cfg.trainer.seed,
                progress=lambda line: self.events.on_stage(line, 0, 1),
            )
        return self.base_dir

    def load_tokenizer(self) -> Any:
        from alight.models.chat_templates import load_tokenizer

        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.base_model(), self.cfg.engine.chat_template)
        return self.tokenizer

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id or 0)

    # -- preparing --------------------------------------------------------------------------------
    def prepare(self, resume: tuple[Path, dict[str, Any], Any] | None = None, *, warm_start: bool = True) -> Path:
        """Load the backend: from the checkpoint `resume` (path, state, RNG), else warm-started when
        configured (and `warm_start`) and checkpointed as step 0. Returns the model directory the
        engine serves first."""
        from alight.backends.factory import make_backend

        cfg = self.cfg
        ckpt.seed_everything(cfg.trainer.seed)
        base = self.base_model()
        self.events.on_stage("loading the model", 0, 1)
        self.load_tokenizer()
        self.backend = make_backend(cfg, base, work_dir=self.session.run_dir / BACKEND_DIR)
        if resume is not None:
            path, _, rng = resume
            self.backend.load(path)
            ckpt.restore_rng(rng)
            return path
        if warm_start and self.warm_starts():
            self.warm_start()
            return self.save()
        return base

    def warm_starts(self) -> bool:
        """Whether the config asks for a supervised warm start."""
        return self.cfg.warm_start.steps > 0 and bool(self.cfg.warm_start.data)

    def warm_start(self) -> None:
        from alight.adapters.demonstrations import demonstration_transitions
        from alight.data import load_rows

        ws = self.cfg.warm_start
        assert ws.data is not None and self.backend is not None
        self.events.on_stage("generating demonstrations", 0, 1)
        rows = load_rows(ws.data, size=ws.size, seed=self.cfg.trainer.seed, generator_kwargs=ws.generator_kwargs)
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
        batches = demonstration_batches(transitions, ws.batch_size, self.pad_id, self.cfg.trainer.seed)
        self.events.on_stage("warm start", 0, ws.steps)

        def progress(step: int, loss: float) -> None:
            nonlocal last
            # Every 10 steps, and at least every second on a slow machine: the dashboard's loss curve.
            if step % 10 == 0 or step == ws.steps or time.monotonic() - last >= 1.0:
                last = time.monotonic()
                self.events.on_stage("warm start", step, ws.steps, {"loss": round(loss, 4)})
            if step % 100 == 0:
                logger.info("warm start: step %d/%d, loss %.4f", step, ws.steps, loss)

        with self.session.threads.updating():  # the warm start runs alone, as an update does
            loss = self.backend.warm_start(
                batches, steps=ws.steps, lr=ws.lr, warmup_steps=ws.warmup_steps, on_progress=progress
            )
        self.warm_start_metrics = {"warm_start/loss": loss, "timing/warm_start_s": time.monotonic() - started}
        logger.info("warm start done: loss %.4f in %.1f s", loss, self.warm_start_metrics["timing/warm_start_s"])

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self) -> Path:
        """Checkpoint the backend at the session's step (weights, optimizer, RNG, data position)."""
        assert self.base_dir is not None and self.backend is not None
        progress = self.session.progress
        if progress.step == 0:  # later checkpoints save between steps, inside the step's own time
            self.events.on_stage("saving the checkpoint", 0, 1)
        path = ckpt.save_checkpoint(
            self.session.run_dir,
            progress.step,
            self.backend,
            {
                **progress.extra,
                "position": progress.position,
                "weights_version": progress.step,
                "total_steps": self.total_steps,
            },
            tokenizer_dir=self.base_dir,
            rng=ckpt.rng_state(),
            keep=self.cfg.trainer.keep_checkpoints,
        )
        progress.saved_step = progress.step
        logger.info("checkpoint %s", path)
        return path

    def save_on_stop(self) -> None:
        """The checkpoint of the last completed step, unless it is written already (or step 0 of a
        run without a warm start: nothing to resume from), or no backend is held."""
        progress = self.session.progress
        if progress.step > progress.saved_step and progress.step > 0 and self.backend is not None:
            self.save()

    def close(self) -> None:
        """Close the backend and drop it (after a warm start that only serves, its memory is the
        engine's)."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None
