"""The trainer: `Trainer.fit` / `Trainer.dev` wire store, proxy + engine, runners, LightningRL and a backend."""

from alight.trainer.result import FitResult
from alight.trainer.trainer import Trainer, entrypoint_of

__all__ = ["FitResult", "Trainer", "entrypoint_of"]
