"""Runners: claim rollouts from the store, run the user's agent on them, report how they ended.

`Runner` is one loop in-process. One supervisor (`alight.runner.supervisor`) keeps `n_runners` of
them alive over a transport (`alight.runner.transport`): it kills hung runners, replaces dead ones
with a backoff and a restart budget, scales and drains. `RunnerPool` runs them in worker
processes, `RayRunnerPool` as Ray actors; both keep the `Pool` protocol, and `make_pool` picks one
by `runner.backend`; `run_pool_until_interrupted` is the `alight runner` command's body.
"""

from __future__ import annotations

from alight.runner.base import Pool
from alight.runner.factory import POOLS, check_pool, make_pool
from alight.runner.pool import RunnerPool
from alight.runner.ray_pool import RayRunnerPool
from alight.runner.runner import AttemptWatcher, Runner
from alight.runner.service import run_pool_until_interrupted
from alight.runner.slots import PoolStats

__all__ = [
    "POOLS",
    "AttemptWatcher",
    "Pool",
    "PoolStats",
    "RayRunnerPool",
    "Runner",
    "RunnerPool",
    "check_pool",
    "make_pool",
    "run_pool_until_interrupted",
]
