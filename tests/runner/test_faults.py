"""Fault injection through a real pool: agents that raise, hang (in a thread, on the event loop,
blocking the loop) and kill their worker, against a real store server; every rollout ends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from alight.runner import RunnerPool
from alight.store.client import StoreClient
from alight.types import AttemptStatus, Rollout, RolloutStatus, Task

from .conftest import AGENTS

TIMEOUT_S = 2.0
FAULTS = {
    # rollout index: (task, expected final status, expected attempt count, first attempt's status)
    1: ({"fault": "raise"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.FAILED),
    11: ({"fault": "raise"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.FAILED),
    21: ({"fault": "raise"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.FAILED),
    31: ({"fault": "raise", "on": [1, 2]}, RolloutStatus.FAILED, 2, AttemptStatus.FAILED),
    5: ({"fault": "sync_hang"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.TIMEOUT),
    15: ({"fault": "async_hang"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.TIMEOUT),
    25: ({"fault": "block_loop"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.TIMEOUT),
    35: ({"fault": "sigkill"}, RolloutStatus.SUCCEEDED, 2, AttemptStatus.FAILED),
}


def _task(i: int) -> dict[str, Any]:
    if i in FAULTS:
        return dict(FAULTS[i][0])
    return {"emit": 0.5} if i % 2 else {"reward": 1.0}


async def _enqueue(url: str, n: int) -> list[str]:
    async with StoreClient(url) as client:
        rollouts = [Rollout(task=Task(input=_task(i)), max_attempts=2, timeout_s=TIMEOUT_S) for i in range(n)]
        return [r.rollout_id for r in await client.enqueue(rollouts)]


async def _results(url: str, ids: list[str]) -> tuple[list[Rollout], list[list[Any]]]:
    async with StoreClient(url) as client:
        rollouts = [await client.get_rollout(rid) for rid in ids]
        attempts = [await client.list_attempts(rid) for rid in ids]
        return rollouts, attempts


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_rollout_ends_and_the_pool_survives_its_faults(store_server: Any) -> None:
    url = store_server.url
    ids = asyncio.run(_enqueue(url, 50))
    started = time.monotonic()
    # No instrumentation: the agent makes no LLM calls, and workers start seconds sooner.
    with RunnerPool(f"{AGENTS}:fault_agent", url, n_runners=3, kill_grace_s=3.0, instrument=False) as pool:
        assert pool.wait_for_idle(timeout_s=90), pool.stats()
        elapsed = time.monotonic() - started
        stats = pool.stats()
        while stats.workers_alive < 3 and time.monotonic() - started < 100:  # the last replacement may be starting
            time.sleep(0.1)
            stats = pool.stats()
    rollouts, attempts = asyncio.run(_results(url, ids))

    assert all(r.status.is_terminal for r in rollouts), [(i, r.status) for i, r in enumerate(rollouts)]
    for i, (rollout, tries) in enumerate(zip(rollouts, attempts, strict=True)):
        assert all(a.status.is_terminal for a in tries), (i, tries)
        if i not in FAULTS:
            assert (rollout.status, rollout.attempt_count) == (RolloutStatus.SUCCEEDED, 1), (i, tries)
            assert rollout.reward == (0.5 if i % 2 else 1.0)
            continue
        _, final, count, first = FAULTS[i]
        assert (rollout.status, rollout.attempt_count, tries[0].status) == (final, count, first), (i, tries)
        if final is RolloutStatus.SUCCEEDED:
            assert rollout.reward == 1.0 and tries[-1].status is AttemptStatus.SUCCEEDED
    for i in (1, 11, 21, 31):
        error = attempts[i][0].error or ""
        assert "Traceback" in error and "ValueError: fault injected on attempt 1" in error
    assert "ValueError: fault injected on attempt 2" in (attempts[31][1].error or "")
    assert "worker died (killed by signal SIGKILL)" in (attempts[35][0].error or "")

    # Replaced: the SIGKILLed worker, the one whose thread hung, the one whose event loop blocked.
    assert stats.workers_died == 1
    assert stats.workers_killed == 1
    assert stats.workers_restarted >= 3
    assert stats.workers_alive == 3
    assert stats.attempts_succeeded == 49  # every rollout but 31 succeeds once
    assert elapsed < 60


@pytest.mark.timeout(120)
def test_a_runner_stopped_with_sigstop_past_its_deadline_is_killed_and_its_rollout_runs_again(
    store_server: Any,
) -> None:
    """SIGSTOP freezes a worker (a host swapping, a debugger): it can neither finish nor answer.
    Past its attempt's deadline the supervisor kills it (SIGKILL reaches a stopped process), the
    attempt times out, the rollout runs again elsewhere, and a fresh worker takes the seat."""
    import os
    import signal

    import psutil

    url = store_server.url

    async def enqueue() -> list[str]:
        async with StoreClient(url) as client:
            rollouts = [Rollout(task=Task(input={"sleep": 1.0}), max_attempts=2, timeout_s=3.0) for _ in range(6)]
            return [r.rollout_id for r in await client.enqueue(rollouts)]

    ids = asyncio.run(enqueue())
    with RunnerPool(f"{AGENTS}:slow", url, n_runners=2, kill_grace_s=1.0, instrument=False) as pool:
        deadline = time.monotonic() + 60
        while pool.stats().workers_busy < 2:  # both workers hold an attempt
            assert time.monotonic() < deadline, pool.stats()
            time.sleep(0.05)
        workers = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2
        os.kill(workers[0].pid, signal.SIGSTOP)
        assert pool.wait_for_idle(timeout_s=60), pool.stats()
        stats = pool.stats()
    rollouts, attempts = asyncio.run(_results(url, ids))
    assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts), [r.status for r in rollouts]
    timed_out = [tries for tries in attempts if tries[0].status is AttemptStatus.TIMEOUT]
    assert len(timed_out) == 1 and timed_out[0][1].status is AttemptStatus.SUCCEEDED  # ran again, once
    assert stats.workers_killed == 1 and stats.workers_restarted >= 1
    assert not workers[0].is_running() or workers[0].status() == psutil.STATUS_ZOMBIE
