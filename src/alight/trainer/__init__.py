"""The trainer: `Trainer.fit` / `Trainer.dev` wire store, proxy + engine, runners, LightningRL and a backend."""

from alight.trainer.trainer import FitResult, Trainer, entrypoint_of

__all__ = ["FitResult", "Trainer", "entrypoint_of"]
