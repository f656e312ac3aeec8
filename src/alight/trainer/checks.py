"""Validate once: every setting a run cannot start with, checked in one pass before anything
starts (one-line `ConfigError`s), each part's check called once.

Every command that runs a config calls `validate` once, before anything starts: `Trainer.fit`
(`alight train`) with the training checks, `alight dev` and `alight eval` without them; the loops,
the backend factory, the stack and the runner pool then trust the config they are given. Each rule
lives with its part (`check_config` of the engine kind, the backend, the loop, the store, the pool,
the agent's sandbox and reward); closed choices are typed in the schema, so a loaded config holds
one of them already.
"""

from __future__ import annotations

from alight.config.schema import ALGORITHMS, ON_STALE, ExperimentConfig
from alight.config.schema import TRAINER_MODES as MODES
from alight.engines.factory import ENGINES, engine_class, engine_options
from alight.errors import ConfigError

# The closed choices are typed in the schema (a loaded config holds one of them already); checked
# again here for configs built in Python.


def validate(cfg: ExperimentConfig, *, training: bool = True, engine: bool = True) -> str | None:
    """ConfigError, in one line, for the first setting `cfg` cannot run with (see the module
    docstring). With `training` (`alight train`), also the trainer's, the loop's and the backend's
    settings, and returns the loop that runs `cfg` (a kind in `alight.trainer.loops.LOOPS`); the
    commands that run the agent without training (`dev`, `eval`) check the rest, the engine's
    settings only where they use the config's `engine` (`engine`; `eval` of endpoints does not)."""
    from alight.agent_setup import runner_agent
    from alight.runner.factory import check_pool
    from alight.store.factory import check_store

    engine_class(cfg.engine.kind)  # an unknown engine.kind: one line, naming the kinds
    kind = _check_training(cfg) if training else None
    if engine:
        check_engine(cfg)
    check_store(cfg.store)
    check_pool(cfg.runner)
    runner_agent(cfg.agent, reward=cfg.reward)  # a bad entrypoint, program, sandbox or tests reward: one line
    return kind


def _check_training(cfg: ExperimentConfig) -> str:
    from alight.backends.factory import check_backend
    from alight.trainer.loops import LOOPS, loop_kind

    check_trainer(cfg)
    name = cfg.algorithm.name
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm.name must be one of {', '.join(ALGORITHMS)}, got {name!r}")
    kind = loop_kind(cfg)
    loop = LOOPS.get(kind)
    if loop.trains_weights:
        if not engine_class(cfg.engine.kind).capabilities.trainable:
            trainable = [name for name in ENGINES if engine_class(name).capabilities.trainable]
            alternatives = " or ".join(trainable)
            raise ConfigError(
                f"engine.kind {cfg.engine.kind} serves a model alight cannot update; train with {alternatives}"
            )
        check_backend(cfg)
    loop.check_config(cfg)
    return kind


def check_engine(cfg: ExperimentConfig) -> None:
    """The engine's settings, before the warm start, as its kind checks them (`Engine.check_config`:
    e.g. where vLLM is and what its build cannot do); with the options the backend adds."""
    from alight.backends.factory import backend_for

    options = engine_options(cfg.engine)
    if cfg.algorithm.name != "apo":
        options.update(backend_for(cfg).engine_options(cfg))
    engine_class(cfg.engine.kind).check_config(options)


def check_trainer(cfg: ExperimentConfig) -> None:
    t = cfg.trainer
    checks = {
        "steps": t.steps is None or t.steps >= 1,
        "epochs": t.epochs >= 1,
        "batch_size": t.batch_size >= 1,
        "group_size": t.group_size >= 1,
        "val_every": t.val_every >= 0,
        "save_every": t.save_every >= 0,
        "keep_checkpoints": t.keep_checkpoints >= 1,
        "step_timeout_s": t.step_timeout_s > 0,
        "min_batch_fraction": 0 < t.min_batch_fraction <= 1,
        "max_staleness": t.max_staleness >= 0,
    }
    bad = [name for name, ok in checks.items() if not ok]
    if bad:
        raise ConfigError(f"trainer.{bad[0]} is out of range: {getattr(t, bad[0])!r}")
    for name, allowed in (("mode", MODES), ("on_stale", ON_STALE)):
        if getattr(t, name) not in allowed:
            raise ConfigError(f"trainer.{name} must be one of {', '.join(allowed)}, got {getattr(t, name)!r}")
    if t.mode == "async" and cfg.algorithm.name == "apo":
        raise ConfigError("trainer.mode=async trains weights; algorithm.name=apo searches prompts (use mode=sync)")
    if t.mode == "async" and cfg.data.from_store is not None:
        raise ConfigError("trainer.mode=async runs rollouts; data.from_store trains on stored ones (use mode=sync)")
    for name in ("n_gpus_per_node", "nnodes"):
        if getattr(t, name) < 1:
            raise ConfigError(f"trainer.{name} is out of range: {getattr(t, name)!r}")
    if cfg.algorithm.name not in ("sft", "apo") and t.group_size < 2 and cfg.algorithm.advantage in ("grpo", "rloo"):
        raise ConfigError(f"trainer.group_size must be at least 2 for {cfg.algorithm.advantage} advantages")
