"""`make_backend`: the policy-update backend chosen by `trainer.backend` (heavy imports stay lazy).

Each backend class offers, beside the `Backend` protocol its instances follow:

- `selects(cfg)`: whether it trains `cfg`; `trainer.backend` names one or more classes
  (`BACKENDS`, the most specific first) and the first that selects the config trains it;
- `check_config(cfg)`: settings it cannot run with, a missing extra: one `ConfigError` line,
  before anything starts;
- `engine_options(cfg)`: options the engine needs to serve what it trains (e.g. one adapter per
  agent), merged into the engine's own by the stack; `{}` for full weights;
- `from_config(cfg, model_dir, *, work_dir)`: the backend, holding the policy loaded from `model_dir`.

A new backend is a module plus one `register_backend` call: a `trainer.backend` choice of its own,
or (`refines`) a class tried before an existing choice's (as per-agent LoRA refines embedded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alight.backends.base import Backend
from alight.backends.checks import check_algorithm
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.parts import Registry

#: Backend classes by name, as `module:Class` (importing one imports no heavy dependency).
CLASSES: Registry[Any] = Registry(
    "backend class",
    {
        "embedded": "alight.backends.embedded:EmbeddedBackend",
        "per_agent_lora": "alight.backends.per_agent_lora:PerAgentLoraBackend",
        "verl": "alight.backends.verl.backend:VerlBackend",
    },
)
#: `trainer.backend` -> the classes that may train it, the most specific first (the last selects every config).
BACKENDS = {"embedded": ("per_agent_lora", "embedded"), "verl": ("verl",)}


def register_backend(name: str, target: str | type, *, refines: str | None = None) -> None:
    """Make the backend class `target` ("module:Class" or the class) trainable: as the choice
    `trainer.backend=name`, or with `refines`, tried first for that choice (it trains the configs
    its `selects` accepts, the others fall through to the choice's own classes)."""
    CLASSES.register(name, target)
    if refines is None:
        BACKENDS[name] = (name,)
    else:
        BACKENDS[refines] = (name, *(c for c in BACKENDS[refines] if c != name))


def unregister_backend(name: str) -> None:
    """Forget `name` (a test's own backend, at its end)."""
    CLASSES.unregister(name)
    BACKENDS.pop(name, None)
    for choice, names in list(BACKENDS.items()):
        BACKENDS[choice] = tuple(n for n in names if n != name)


def backend_class(name: str) -> Any:
    """The backend class `name` (registered in `CLASSES`)."""
    return CLASSES.get(name)


def backend_for(cfg: ExperimentConfig) -> Any:
    """The class that trains `cfg`: of those `trainer.backend` names, the first that selects it."""
    names = BACKENDS.get(cfg.trainer.backend)
    if names is None:
        raise ConfigError(f"trainer.backend must be one of {', '.join(BACKENDS)}, got {cfg.trainer.backend!r}")
    return next(cls for cls in map(backend_class, names) if cls.selects(cfg))


def check_backend(cfg: ExperimentConfig) -> None:
    """ConfigError, in one line, for an algorithm or backend setting no update can run with."""
    check_algorithm(cfg.algorithm)
    if cfg.algorithm.micro_batch_size == "auto" and cfg.trainer.backend != "embedded":
        raise ConfigError(
            f"algorithm.micro_batch_size=auto: embedded backend only; set a number for {cfg.trainer.backend}"
        )
    backend_for(cfg).check_config(cfg)


def make_backend(cfg: ExperimentConfig, model_dir: Path, *, work_dir: Path | None = None) -> Backend:
    """The configured backend, holding the policy loaded from `model_dir`; `work_dir` (the run
    directory's `backend/`) holds what it writes between checkpoints (default: a temporary one). The
    config is checked already (`check_backend`, once, with the rest of the run's config)."""
    backend: Backend = backend_for(cfg).from_config(cfg, model_dir, work_dir=work_dir)
    return backend
