"""Both runner pools keep the `Pool` protocol's promises, checked by the same test: built by
`make_pool` from `runner.backend`, they start, run rollouts from a real store server, report
their counts, scale up and down, go idle, and stop by draining (a second stop is a no-op)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from alight.config.schema import RayConfig, RunnerConfig
from alight.runner.base import Pool
from alight.runner.factory import make_pool
from alight.store.client import StoreClient
from alight.types import Rollout, RolloutStatus, Task

from .conftest import AGENTS


async def _run(url: str, tasks: list[Any]) -> list[Rollout]:
    async with StoreClient(url) as client:
        ids = [r.rollout_id for r in await client.enqueue([Rollout(task=Task(input=t)) for t in tasks])]
        done = await client.wait_for_rollouts(ids, timeout=60)
        assert len(done) == len(ids), "rollouts did not end in time"
        return done


def _eventually_alive(pool: Pool, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pool.stats().workers_alive != n:
        assert time.monotonic() < deadline, f"{pool.stats().workers_alive} runners alive, not {n}"
        time.sleep(0.05)


@pytest.fixture(params=["local", "ray"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")  # a local Ray cluster of 2 CPUs for this module
    return str(request.param)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_pool_keeps_the_protocol(backend: str, store_server: Any) -> None:
    cfg = RunnerConfig(backend=backend, n_runners=2, drain_timeout_s=10.0, ray=RayConfig(num_cpus=0.5))
    pool = make_pool(cfg, f"{AGENTS}:slow", store_server.url, instrument=False)
    assert isinstance(pool, Pool) and not pool.running
    with pool:
        assert pool.running and pool.n_runners == 2
        done = asyncio.run(_run(store_server.url, [{"sleep": 0.05}] * 4))
        assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 4
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
        counts = (stats.attempts_succeeded, stats.workers_started, stats.workers_alive, stats.workers_busy)
        assert counts == (4, 2, 2, 0)

        pool.scale(3)
        _eventually_alive(pool, 3)
        pool.scale(1)  # the surplus drain and go, and are not replaced
        _eventually_alive(pool, 1)
        assert pool.running and pool.n_runners == 1
        assert [r.status for r in asyncio.run(_run(store_server.url, [{"sleep": 0.05}] * 2))] == [
            RolloutStatus.SUCCEEDED
        ] * 2
        assert pool.wait_for_idle(timeout_s=30)
    stats = pool.stats()
    assert not pool.running
    assert (stats.attempts_succeeded, stats.workers_started, stats.workers_alive) == (6, 3, 0)
    assert (stats.workers_died, stats.workers_killed, stats.workers_restarted, stats.attempts_failed) == (0, 0, 0, 0)
    pool.stop()  # a second stop is a no-op
