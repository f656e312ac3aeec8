"""What every loop's run shares, whatever it trains: the run directory and its log file, the copy
of the config, the metrics log, the watchers, the step counters, signal handling and the result.

    with RunSession(cfg, run_dir, resume=False, watchers=[...]) as session:
        session.announce({...})
        stopped = session.guarded(work, on_stop=save)   # SIGINT / SIGTERM: on_stop, then stopped
        return session.finish(stopped)

A loop (`alight.trainer.loops`) composes a session with a `Policy` and the stack; it does not
inherit from another loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from alight.config.schema import ExperimentConfig
from alight.errors import TrainingError
from alight.trainer import checkpoint as ckpt
from alight.trainer.events import Watchers
from alight.trainer.interrupt import GracefulStop
from alight.trainer.ledger import CONSUMED, SET_ASIDE
from alight.trainer.metrics import MetricsLog
from alight.trainer.result import FitResult
from alight.trainer.threads import ThreadPolicy

logger = logging.getLogger(__name__)

LOG_FILE = "train.log"
CONFIG_FILE = "config.yaml"


@dataclasses.dataclass
class Progress:
    """Where a run stands: the last completed step, the last checkpointed one, the data position."""

    step: int = 0
    saved_step: int = -1
    position: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # a loop's own state, saved with each checkpoint


class RunSession:
    """One run's directory, log, metrics and watchers while it is entered (see the module docstring)."""

    def __init__(
        self, cfg: ExperimentConfig, run_dir: Path, *, resume: bool = False, watchers: Sequence[Any] = ()
    ) -> None:
        t = cfg.trainer
        self.cfg = cfg
        self.run_dir = run_dir
        self.resume = resume
        self.events = Watchers(watchers)
        self.threads = ThreadPolicy.from_config(t.torch_threads, t.torch_interop_threads, t.device, mode=t.mode)
        self.progress = Progress()
        self.started = time.monotonic()
        self.interrupt = GracefulStop()  # SIGINT / SIGTERM: checkpoint, then stop
        self.metrics_log: MetricsLog | None = None
        self._handler: logging.Handler | None = None

    # -- entering and leaving -------------------------------------------------------------------
    def __enter__(self) -> RunSession:
        from alight.models.progress import quiet_progress_bars

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._handler = self._log_to_file()
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
        except BaseException:
            self._close_handler()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._close_handler()

    def _close_handler(self) -> None:
        if self._handler is not None:
            logging.getLogger("alight").removeHandler(self._handler)
            self._handler.close()
            self._handler = None

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

    @property
    def log(self) -> MetricsLog:
        assert self.metrics_log is not None, "the session is not entered"
        return self.metrics_log

    # -- resuming ---------------------------------------------------------------------------------
    def resume_point(self) -> tuple[Path, dict[str, Any], Any]:
        """The newest checkpoint (its path, trainer state and RNG state); sets the step, the data
        position, and drops the metrics logged after it. Its weights load with the policy."""
        from alight.errors import ConfigError

        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            raise ConfigError(f"--resume: {self.run_dir} holds no checkpoint")
        step, path = latest
        state, rng = ckpt.load_state(path)
        self.progress = Progress(step=step, saved_step=step, position=int(state.get("position", 0)))
        self.log.truncate_after(step)
        logger.info("resuming %s from step %d", self.run_dir, step)
        return path, state, rng

    def logged_steps(self) -> set[Any]:
        return {r.get("step") for r in self.log.rows()}

    # -- signals ----------------------------------------------------------------------------------
    def guarded(self, work: Callable[[], None], on_stop: Callable[[], None]) -> bool:
        """Run `work` with SIGINT / SIGTERM handled; when a signal stopped it, call `on_stop` (the
        last checkpoint) and return True."""
        stopped = False
        with self.interrupt:
            try:
                work()
            except KeyboardInterrupt:
                stopped = True
            stopped = stopped or self.interrupt.requested is not None
            if stopped:
                logger.warning("stopped at step %d", self.progress.step)
                on_stop()
        return stopped

    def stopping(self) -> bool:
        """Whether a signal asked the run to stop (after the step that just ended)."""
        return self.interrupt.requested is not None

    def run_async(self, work: Coroutine[Any, Any, None]) -> None:
        """Run the asyncio part of the run; the first SIGINT/SIGTERM cancels it unless an update is
        running (then the loop stops after it); see `alight.trainer.interrupt`."""
        asyncio.run(self._interruptible(work))

    async def _interruptible(self, work: Coroutine[Any, Any, None]) -> None:
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

    # -- metrics and the end --------------------------------------------------------------------
    def announce(self, info: dict[str, Any]) -> None:
        """The first event of a run, before anything slow (a resumed run's history added)."""
        self.events.on_start(
            {
                "run_name": self.run_dir.name,
                "run_dir": str(self.run_dir),
                **info,
                "resumed_from": self.progress.step if self.resume else None,
                "history": self.log.rows() if self.resume else [],
            }
        )

    def record(self, metrics: dict[str, Any]) -> None:
        """Log one step's metrics (non-finite floats as null) and tell the watchers; a step all of
        whose rollouts failed ends the run."""
        consumed, set_aside = metrics.pop(CONSUMED, None), metrics.pop(SET_ASIDE, ())
        metrics["time_s"] = round(time.monotonic() - self.started, 3)
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self.log.log(clean, consumed, set_aside)
        self.events.on_step(clean)
        if (clean.get("step") or 0) > 0 and clean.get("rollouts/succeeded", 1) == 0:
            raise TrainingError(f"step {clean['step']}: every rollout failed; see {self.run_dir / LOG_FILE}")

    def finish(self, stopped: bool) -> FitResult:
        rows = self.log.rows()
        self.log.close()
        png = self.run_dir / "reward_curve.png"
        val = [r["val/reward_mean"] for r in rows if r.get("val/reward_mean") is not None]
        start = next((r["val/reward_mean"] for r in rows if r.get("step") == 0 and "val/reward_mean" in r), None)
        result = FitResult(
            run_dir=self.run_dir,
            steps=self.progress.step,
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
