"""`MetricsLog`: a run's metrics, one JSON line per step, kept through kills and resumes.

The JSON-lines file in the run directory is the record; TensorBoard and Weights & Biases get a
copy when the config asks for them, and `close` draws the reward curve as a PNG.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import numbers
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from alight.config.schema import LoggingConfig
from alight.errors import ConfigError
from alight.trainer.ledger import Ledger, append_line

logger = logging.getLogger(__name__)

TRAIN_REWARD, VAL_REWARD = "train/reward_mean", "val/reward_mean"
PNG_NAME = "reward_curve.png"


class MetricsLog:
    """Appends each step's metrics to `run_dir / cfg.metrics_file` and forwards them to TB/W&B.

    Every `log` is flushed and fsynced, so a killed run keeps each step it logged. Without
    `resume` an existing file is replaced; with it, the file is kept (a line torn by a kill is
    dropped) and the trainer calls `truncate_after(checkpoint_step)`.
    """

    def __init__(
        self,
        run_dir: Path,
        cfg: LoggingConfig,
        *,
        run_name: str,
        config: dict[str, Any] | None = None,
        resume: bool = False,
    ) -> None:
        _check_extras(cfg)  # a missing extra fails before anything is written
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.run_name = run_name
        self.path = self.run_dir / cfg.metrics_file
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._tensorboard: Any = None
        self._wandb: Any = None
        if cfg.wandb:  # first: it is the one that can refuse to start (no API key, no server)
            self._wandb = _start_wandb(self.run_dir, cfg.wandb_project, run_name, config, resume)
        if cfg.tensorboard:
            self._tensorboard = self._open_tensorboard()
        if resume:
            self._drop_torn_tail()
        elif self.path.exists() and self.path.stat().st_size:
            logger.warning("replacing %s: the run does not resume", self.path)
        # unbuffered: a failed write leaves nothing pending to fail again at close
        self._file = self.path.open("ab" if resume else "wb", buffering=0)
        self.ledger = Ledger(self.run_dir, resume=resume)
        self._closed = False

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def log(
        self, metrics: dict[str, Any], consumed: Sequence[Sequence[str]] | None = None, set_aside: Sequence[str] = ()
    ) -> None:
        """Append one step's metrics (`metrics["step"]` is required) and make it durable; with
        `consumed`, the (rollout, attempt) ids its update trained on (and the rollouts it `set_aside`)
        go to the ledger first (`alight.trainer.ledger`)."""
        if "step" not in metrics:
            raise ValueError("metrics need a 'step'")
        row = {str(k): _json_value(v) for k, v in metrics.items()}
        if consumed is not None:  # first: the metrics line is what says the step is done
            self.ledger.append(int(metrics["step"]), consumed, set_aside)
        line = (json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n").encode()
        append_line(self._file, line, self.run_dir, f"the metrics of step {metrics['step']}")
        step = int(metrics["step"])
        scalars = {k: v for k, v in row.items() if k != "step" and _is_number(v)}
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def truncate_after(self, step: int) -> None:
        """Keep only the lines of steps <= `step` (a resumed run redoes the later ones); atomic."""
        kept = [line for line, row in self._lines() if isinstance(row.get("step"), int) and row["step"] <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in kept)
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        _fsync_dir(self.run_dir)
        self._file = self.path.open("ab", buffering=0)
        self.ledger.truncate_after(step)
        if self._tensorboard is not None:
            # TensorBoard drops the older files' points from purge_step on, so redone steps are not drawn twice.
            self._tensorboard.close()
            self._tensorboard = self._open_tensorboard(purge_step=step + 1)

    def rows(self) -> list[dict[str, Any]]:
        """The metrics the file holds, one dict per logged step."""
        return [row for _, row in self._lines()]

    def plot(self, path: Path | None = None) -> Path | None:
        """Draw the reward curve (train mean per step, val mean where measured) to a PNG.

        Returns the PNG's path, or None when no step has a reward yet.
        """
        rows = self.rows()
        train = _points(rows, TRAIN_REWARD)
        val = _points(rows, VAL_REWARD)
        if not train and not val:
            logger.info("no reward logged yet: no reward curve")
            return None
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=(7.0, 4.0), dpi=120)
        FigureCanvasAgg(fig)  # draws without pyplot, so no GUI backend is chosen and no global state set
        ax = fig.add_subplot()
        if train:
            xs, ys = zip(*train, strict=True)
            ax.plot(xs, ys, color="tab:blue", linewidth=1.5, label="train reward (mean)")
            std = dict(_points(rows, "train/reward_std"))
            if len(std) == len(train):
                lo = [y - std[x] for x, y in train]
                hi = [y + std[x] for x, y in train]
                ax.fill_between(xs, lo, hi, color="tab:blue", alpha=0.12, linewidth=0, label="± std")
        if val:
            vx, vy = zip(*val, strict=True)
            ax.plot(vx, vy, "o-", color="tab:orange", markersize=4, clip_on=False, label="val reward (mean)")
        values = [y for _, y in train + val]
        if all(0.0 <= v <= 1.0 for v in values):
            ax.set_ylim(0.0, 1.0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.set_title(self.run_name)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        target = path or self.run_dir / PNG_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(target)
        return target

    def close(self) -> Path | None:
        """Close the file and TB/W&B; draw the reward curve when `cfg.plot`. Returns the PNG, if any."""
        if self._closed:
            return None
        self._closed = True
        self._file.close()
        self.ledger.close()
        png = None
        if self.cfg.plot:
            try:
                png = self.plot()
            except Exception:  # a failed drawing must not fail a finished run
                logger.warning("could not draw the reward curve", exc_info=True)
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        return png

    def _open_tensorboard(self, purge_step: int | None = None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge_step)

    def _lines(self) -> list[tuple[str, dict[str, Any]]]:
        if not self.path.exists():
            return []
        raw = self.path.read_text(encoding="utf-8").split("\n")
        parsed = []
        for i, line in enumerate(raw):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                if i < len(raw) - 1:  # the last line may be torn by a kill; others should not be
                    logger.warning("%s:%d is not JSON; skipped", self.path, i + 1)
                continue
            if isinstance(row, dict):
                parsed.append((line, row))
        return parsed

    def _drop_torn_tail(self) -> None:
        # A kill mid-write leaves a last line without its newline: cut it, so the next log starts clean.
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        logger.warning("%s: dropping a torn last line", self.path)
        with self.path.open("r+b") as f:
            f.truncate(cut)
            os.fsync(f.fileno())


def _check_extras(cfg: LoggingConfig) -> None:
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError('logging.tensorboard needs TensorBoard: pip install "alight[tracking]"')
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError('logging.wandb needs Weights & Biases: pip install "alight[tracking]"')


def _start_wandb(run_dir: Path, project: str, name: str, config: dict[str, Any] | None, resume: bool) -> Any:
    wandb = importlib.import_module("wandb")
    # The run id is kept in the run directory, so a resumed run continues the same W&B run.
    id_file = run_dir / "wandb_run_id"
    run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    # The dashboard redraws the terminal 4 times a second: W&B would store every frame (train.log keeps the log).
    settings = wandb.Settings(console="off")
    try:
        return wandb.init(
            project=project, name=name, id=run_id, config=config, dir=str(run_dir), resume="allow", settings=settings
        )
    except wandb.errors.Error as err:  # no API key, no server: say so in one line, before the run starts
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"logging.wandb: {first} (WANDB_MODE=offline keeps the run on disk)") from None


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None  # strict JSON has no NaN
    if hasattr(value, "item"):  # a 0-d tensor or array
        return _json_value(value.item())
    return str(value)


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[key])) for row in rows if _is_number(row.get(key)) and "step" in row]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
