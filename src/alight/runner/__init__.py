"""Runners: claim rollouts from the store, run the user's agent on them, report how they ended.

`Runner` is one loop in-process; `RunnerPool` runs `n_runners` of them in worker processes under
a supervisor that kills hung workers and replaces dead ones; `run_pool_until_interrupted` is the
`alight runner` command's body.
"""

from __future__ import annotations

from alight.runner.pool import RunnerPool
from alight.runner.runner import AttemptWatcher, Runner
from alight.runner.service import run_pool_until_interrupted
from alight.runner.slots import PoolStats

__all__ = ["AttemptWatcher", "PoolStats", "Runner", "RunnerPool", "run_pool_until_interrupted"]
