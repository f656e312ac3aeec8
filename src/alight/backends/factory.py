"""`make_backend`: the policy-update backend chosen by `trainer.backend` (heavy imports stay lazy).

Each backend class offers `check_config(cfg)` (settings it cannot run with, a missing extra: one
`ConfigError` line, before anything starts) and `from_config(cfg, model_dir)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alight.backends.base import Backend
from alight.backends.checks import check_algorithm
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

BACKENDS = ("embedded", "verl")


def backend_class(name: str) -> Any:
    """The class of backend `name`; importing it imports no heavy dependency."""
    if name == "embedded":
        from alight.backends.embedded import EmbeddedBackend

        return EmbeddedBackend
    if name == "verl":
        from alight.backends.verl.backend import VerlBackend

        return VerlBackend
    raise ConfigError(f"trainer.backend must be one of {', '.join(BACKENDS)}, got {name!r}")


def check_backend(cfg: ExperimentConfig) -> None:
    """ConfigError, in one line, for an algorithm or backend setting no update can run with."""
    from alight.backends.per_agent_lora import check_per_agent

    check_algorithm(cfg.algorithm)
    if cfg.algorithm.micro_batch_size == "auto" and cfg.trainer.backend != "embedded":
        raise ConfigError(
            f"algorithm.micro_batch_size=auto: embedded backend only; set a number for {cfg.trainer.backend}"
        )
    check_per_agent(cfg)
    backend_class(cfg.trainer.backend).check_config(cfg)


def make_backend(cfg: ExperimentConfig, model_dir: Path, *, work_dir: Path | None = None) -> Backend:
    """The configured backend, holding the policy loaded from `model_dir`; `work_dir` (the run
    directory's `backend/`) holds what it writes between checkpoints (default: a temporary one). The
    config is checked already (`check_backend`, once, with the rest of the run's config)."""
    cls = backend_class(cfg.trainer.backend)
    if cfg.algorithm.lora.per_agent:  # check_backend allows it with the embedded backend only
        from alight.backends.per_agent_lora import PerAgentLoraBackend

        cls = PerAgentLoraBackend
    backend: Backend = cls.from_config(cfg, model_dir, work_dir=work_dir)
    return backend
