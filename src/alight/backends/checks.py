"""Algorithm settings every backend checks before it loads anything, and the warm-up schedule."""

from __future__ import annotations

from collections.abc import Callable

from alight.backends import losses
from alight.backends.objective import LOSSES
from alight.backends.precision import check_precision
from alight.config.schema import AlgorithmConfig
from alight.errors import ConfigError


def check_algorithm(cfg: AlgorithmConfig) -> None:
    """ConfigError, in one line, for update settings no update can run with (the algorithm's name
    is checked with the rest of the config, `alight.trainer.checks`)."""
    if cfg.loss not in LOSSES:
        raise ConfigError(f"algorithm.loss must be one of {', '.join(LOSSES)}, got {cfg.loss!r}")
    if cfg.loss_agg not in losses.LOSS_AGGREGATIONS:
        raise ConfigError(
            f"algorithm.loss_agg must be one of {', '.join(losses.LOSS_AGGREGATIONS)}, got {cfg.loss_agg!r}"
        )
    check_precision(cfg.precision)
    if cfg.lora.agents and not cfg.lora.per_agent:
        raise ConfigError("algorithm.lora.agents is set but algorithm.lora.per_agent is false; set per_agent=true")
    if cfg.kl_estimator not in losses.KL_ESTIMATORS:
        raise ConfigError(
            f"algorithm.kl_estimator must be one of {', '.join(losses.KL_ESTIMATORS)}, got {cfg.kl_estimator!r}"
        )
    checks = {
        "lr": cfg.lr > 0,
        "weight_decay": cfg.weight_decay >= 0,
        "micro_batch_size": cfg.micro_batch_size == "auto" or _positive_int(cfg.micro_batch_size),
        "log_prob_chunk": cfg.log_prob_chunk >= 0,
        "memory_fraction": 0 < cfg.memory_fraction <= 1,
        "mini_batch_size": cfg.mini_batch_size is None or cfg.mini_batch_size >= 1,
        "epochs": cfg.epochs >= 1,
        "ppo_epochs": cfg.ppo_epochs >= 1,
        "clip_ratio_low": 0 <= cfg.clip_ratio_low < 1,
        "clip_ratio_high": cfg.clip_ratio_high >= 0,
        "is_cap": cfg.is_cap == 0 or cfg.is_cap >= 1,
        "kl_coef": cfg.kl_coef >= 0,
        "max_grad_norm": cfg.max_grad_norm >= 0,
        "warmup_steps": cfg.warmup_steps >= 0,
        "betas": len(cfg.betas) == 2 and all(0 <= b < 1 for b in cfg.betas),
    }
    bad = [name for name, ok in checks.items() if not ok]
    if bad and bad[0] == "micro_batch_size":
        raise ConfigError(f"algorithm.micro_batch_size must be a positive number or auto, got {cfg.micro_batch_size!r}")
    if bad:
        raise ConfigError(f"algorithm.{bad[0]} is out of range: {getattr(cfg, bad[0])!r}")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def warmup_schedule(warmup_steps: int) -> Callable[[int], float]:
    """Learning-rate factor: linear from 1/(warmup+1) to 1 over `warmup_steps`, then 1."""
    return lambda step: min(1.0, (step + 1) / (warmup_steps + 1)) if warmup_steps else 1.0
