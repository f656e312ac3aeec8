"""Running a pool as a service: until Ctrl-C or SIGTERM, then drain and exit cleanly."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alight.runner.pool import RunnerPool
from alight.runner.slots import PoolStats
from alight.serving.background import sigterm_interrupts

if TYPE_CHECKING:
    from alight.agent import LitAgent

logger = logging.getLogger(__name__)


def run_pool_until_interrupted(
    agent: str | LitAgent,
    store_url: str,
    *,
    n_runners: int = 4,
    tracer: str = "light",
    on_ready: Callable[[RunnerPool], None] | None = None,
    **options: Any,
) -> PoolStats:
    """Run a `RunnerPool` until Ctrl-C or SIGTERM (or until every worker has gone), then drain it:
    workers finish their attempts within `drain_timeout_s`. A second Ctrl-C stops at once (the
    attempts still running are recorded as failed, to be retried). Returns the pool's counts.
    `options` are `RunnerPool` keyword arguments; a bad agent raises ConfigError."""
    pool = RunnerPool(agent, store_url, n_runners=n_runners, tracer=tracer, **options)
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
