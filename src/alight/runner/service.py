"""Running a pool as a service: until Ctrl-C or SIGTERM, then drain and exit cleanly."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alight.config.schema import RayConfig, RunnerConfig
from alight.runner.factory import check_pool, make_pool
from alight.runner.slots import PoolStats
from alight.serving.background import sigterm_interrupts

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.runner.base import Pool

logger = logging.getLogger(__name__)


def run_pool_until_interrupted(
    agent: str | LitAgent,
    store_url: str,
    *,
    n_runners: int = 4,
    tracer: str = "light",
    backend: str = "local",
    ray: RayConfig | None = None,
    on_ready: Callable[[Pool], None] | None = None,
    **options: Any,
) -> PoolStats:
    """Run a runner pool (`backend`: local worker processes or Ray actors, see `make_pool`) until
    Ctrl-C or SIGTERM (or until every runner has gone), then drain it: runners finish their
    attempts within `drain_timeout_s`. A second Ctrl-C stops at once (the attempts still running
    are recorded as failed, to be retried). Returns the pool's counts. `options` are keyword
    arguments of the pools; a bad agent or backend raises ConfigError."""
    cfg = RunnerConfig(backend=backend, n_runners=n_runners, tracer=tracer, ray=ray or RayConfig())
    check_pool(cfg)
    pool = make_pool(cfg, agent, store_url, **options)
    with sigterm_interrupts():
        try:
            try:
                pool.start()
                if on_ready is not None:
                    on_ready(pool)
                while pool.running:
                    time.sleep(0.2)
            except KeyboardInterrupt:
                logger.info("runner pool: stopping; workers finish their attempts (Ctrl-C again to stop now)")
            try:
                pool.stop(drain=True)
            except KeyboardInterrupt:
                logger.info("runner pool: stopping now")
                pool.stop(drain=False)
        finally:
            pool.stop(drain=False)  # no-op once stopped; stops it if start() raised
    return pool.stats()
