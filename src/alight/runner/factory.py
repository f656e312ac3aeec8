"""`make_pool`: the runner pool chosen by `runner.backend` (`local` processes or `ray` actors).

The trainer's stack and `alight runner` build pools only through this module and use them only
through the `Pool` protocol (alight.runner.base). The kinds are registered by name in `POOLS`, each
as "module:Class", so Ray is imported only when a Ray pool starts. A new kind is a `Supervisor`
subclass stating `runners_name`, `check_config` and `from_config`, plus one `POOLS.register` call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alight.config.schema import RunnerConfig
from alight.errors import ConfigError
from alight.parts import Registry

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.runner.base import Pool
    from alight.runner.supervisor import Supervisor

#: The runner pool kinds (`runner.backend`), the default first.
POOLS: Registry[Supervisor] = Registry(
    "runner.backend",
    {
        "local": "alight.runner.pool:RunnerPool",
        "ray": "alight.runner.ray_pool:RayRunnerPool",
    },
)


def pool_class(backend: str) -> type[Supervisor]:
    """The class of the pool kind `backend`; ConfigError naming the kinds for an unknown one."""
    return POOLS.get(backend)


def check_pool(cfg: RunnerConfig) -> None:
    """ConfigError, in one line, for runner settings no pool can start with (before anything runs).
    Cheap (imports nothing heavy, Ray included) and free of effects, so calling it again is harmless."""
    cls = pool_class(cfg.backend)
    if cfg.n_runners < 0:
        count = cfg.n_runners
        raise ConfigError(f"runner.n_runners must be 0 (runners on other machines only) or more, got {count}")
    if cfg.drain_timeout_s < 0:
        raise ConfigError(f"runner.drain_timeout_s must not be negative, got {cfg.drain_timeout_s}")
    cls.check_config(cfg)


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
    return pool_class(cfg.backend).from_config(cfg, agent, store_url, **common)
