"""A run directory: the names of what a run keeps there, and which directory a run uses.

`{output_dir}/{name}[-kind]-{timestamp}/` holds the run's SQLite store (`store.db`), the starting
weights (`base_model/`), its checkpoints (`checkpoints/`, see `checkpoint`), the backend's working
files (`backend/`), the resolved config and the log.
"""

from __future__ import annotations

import time
from pathlib import Path

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

STORE_FILE = "store.db"  # the run's SQLite store
BASE_MODEL_DIR = "base_model"  # the starting weights (the tiny model built with the run's seed, or a copy)
BACKEND_DIR = "backend"  # what the policy backend writes between checkpoints (verl: the policy the engine reloads)


def new_run_dir(cfg: ExperimentConfig, kind: str = "") -> Path:
    """A fresh `{output_dir}/{name}[-kind]-{timestamp}` path (not created)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.trainer.output_dir) / f"{cfg.name}{'-' + kind if kind else ''}-{stamp}"


def latest_run_dir(cfg: ExperimentConfig) -> Path:
    """The newest run directory of this experiment that holds a checkpoint (for `--resume`)."""
    from alight.trainer.checkpoint import latest_checkpoint  # numpy: only when resuming

    root = Path(cfg.trainer.output_dir)
    runs = sorted(
        (p for p in root.glob(f"{cfg.name}-*") if p.is_dir() and latest_checkpoint(p) is not None),
        key=lambda p: p.stat().st_mtime,
    )
    if not runs:
        raise ConfigError(f"--resume: no run of {cfg.name!r} with a checkpoint under {root}")
    return runs[-1]
