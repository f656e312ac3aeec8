"""`make_pool`: the runner pool chosen by `runner.backend` (`local` processes or `ray` actors).

The trainer's stack and `alight runner` build pools only through this module and use them only
through the `Pool` protocol (alight.runner.base); Ray is imported when a Ray pool starts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from alight.config.schema import RayConfig, RunnerConfig
from alight.errors import ConfigError

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.runner.base import Pool

POOL_BACKENDS = ("local", "ray")


def check_pool(cfg: RunnerConfig) -> None:
    """ConfigError, in one line, for runner settings no pool can start with (before anything runs).
    Cheap (imports nothing heavy, Ray included) and free of effects, so calling it again is harmless."""
    if cfg.backend not in POOL_BACKENDS:
        raise ConfigError(f"runner.backend must be one of {', '.join(POOL_BACKENDS)}, got {cfg.backend!r}")
    if cfg.n_runners < 0:
        count = cfg.n_runners
        raise ConfigError(f"runner.n_runners must be 0 (runners on other machines only) or more, got {count}")
    if cfg.drain_timeout_s < 0:
        raise ConfigError(f"runner.drain_timeout_s must not be negative, got {cfg.drain_timeout_s}")
    if cfg.backend == "ray":
        check_ray(cfg.ray)


def check_ray(cfg: RayConfig) -> None:
    """ConfigError for Ray settings that cannot work, or for Ray not being installed."""
    if not (math.isfinite(cfg.num_cpus) and cfg.num_cpus >= 0):
        raise ConfigError(f"runner.ray.num_cpus must be a number >= 0, got {cfg.num_cpus!r}")
    for name, amount in cfg.resources.items():
        if not isinstance(amount, int | float) or not math.isfinite(amount) or amount < 0:
            raise ConfigError(f"runner.ray.resources.{name} must be a number >= 0, got {amount!r}")
    if cfg.local_cpus is not None and cfg.local_cpus < 1:
        raise ConfigError(f"runner.ray.local_cpus must be at least 1, got {cfg.local_cpus}")
    if cfg.address is not None and not (cfg.address == "auto" or ":" in cfg.address):
        raise ConfigError(f"runner.ray.address must be 'auto', HOST:PORT or ray://HOST:PORT, got {cfg.address!r}")
    from alight.runner.ray_cluster import check_ray_installed

    check_ray_installed()


def make_pool(
    cfg: RunnerConfig,
    agent: str | LitAgent,
    store_url: str,
    *,
    n_runners: int | None = None,
    token: str | None = None,
    **options: Any,
) -> Pool:
    """The pool `cfg.backend` names, not started: `n_runners` (default `cfg.n_runners`) runners of
    `agent` on the store server at `store_url` (the URL runners use to reach it). `options` are
    keyword arguments both pools take (`instrument`, `poll_interval_s`, `max_restarts`, ...). `cfg`
    is checked already (`check_pool`, once, by whoever read it)."""
    common: dict[str, Any] = {
        "n_runners": n_runners or cfg.n_runners,
        "tracer": cfg.tracer,
        "drain_timeout_s": cfg.drain_timeout_s,
        "token": token,
        **options,
    }
    if cfg.backend == "ray":
        from alight.runner.ray_pool import RayRunnerPool

        return RayRunnerPool(agent, store_url, ray=cfg.ray, **common)
    from alight.runner.pool import RunnerPool

    return RunnerPool(agent, store_url, **common)
