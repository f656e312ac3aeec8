"""`FitResult`: what a training run did, as `Trainer.fit` returns it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class FitResult:
    """What `Trainer.fit` did."""

    run_dir: Path
    steps: int  # the last RL step completed
    metrics: list[dict[str, Any]]  # one dict per step, as in metrics.jsonl
    val_reward_start: float | None  # val/reward_mean at step 0 (after the warm start)
    val_reward_end: float | None  # the last val/reward_mean
    stopped: bool  # interrupted (Ctrl-C, SIGTERM) before the last step
    png: Path | None
    signal: str | None = None  # the signal that stopped the run: SIGINT | SIGTERM (None: Ctrl-C before the loop ran)
    checkpoint: Path | None = None  # the newest checkpoint (what --resume continues from)
