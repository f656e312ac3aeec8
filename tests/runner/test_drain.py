"""Ctrl-C: a pool in its own process, SIGINT to its whole process group as a terminal sends it.
The workers stop claiming, finish the attempts they hold, and everything exits cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from alight.store.client import StoreClient
from alight.types import AttemptStatus, Rollout, RolloutStatus, Task

from .conftest import AGENTS

SCRIPT = str(Path(__file__).with_name("pool_script.py"))


async def _enqueue(url: str, tasks: list[Any], **fields: Any) -> list[str]:
    async with StoreClient(url) as client:
        return [r.rollout_id for r in await client.enqueue([Rollout(task=Task(input=t), **fields) for t in tasks])]


async def _state(url: str, ids: list[str]) -> tuple[list[Rollout], list[list[Any]]]:
    async with StoreClient(url) as client:
        return [await client.get_rollout(i) for i in ids], [await client.list_attempts(i) for i in ids]


def _start_pool(url: str, agent: str, n: int, drain_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, SCRIPT, url, agent, str(n), str(drain_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the SIGINT below reaches it, not pytest
    )


def _wait_running(url: str, ids: list[str], n: int, proc: subprocess.Popen[str]) -> list[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        _, attempts = asyncio.run(_state(url, ids))
        running = [a.attempt_id for tries in attempts for a in tries if a.status is AttemptStatus.RUNNING]
        if len(running) >= n:
            return running
        time.sleep(0.1)
    raise AssertionError("the pool never ran its attempts")


def _interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_drains_the_attempts_in_flight_and_exits_cleanly(store_server: Any) -> None:
    url = store_server.url
    ids = asyncio.run(_enqueue(url, [{"sleep": 2.0}] * 6))
    proc = _start_pool(url, f"{AGENTS}:slow", 2, 30.0)
    running = _wait_running(url, ids, 2, proc)
    out, err = _interrupt(proc)

    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "STATS 2 0 0" in out, out + err  # two attempts succeeded, none failed, no worker left
    rollouts, attempts = asyncio.run(_state(url, ids))
    finished = {a.attempt_id: a.status for tries in attempts for a in tries}
    assert finished == dict.fromkeys(running, AttemptStatus.SUCCEEDED)  # nothing else was claimed
    assert sorted(r.status for r in rollouts) == [RolloutStatus.QUEUING] * 4 + [RolloutStatus.SUCCEEDED] * 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_attempts_still_running_at_the_drain_timeout_are_failed_and_requeued(store_server: Any) -> None:
    url = store_server.url
    ids = asyncio.run(_enqueue(url, [{"sleep": 1000}], max_attempts=2))
    proc = _start_pool(url, f"{AGENTS}:slow", 1, 1.0)
    [running] = _wait_running(url, ids, 1, proc)
    _, err = _interrupt(proc)

    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    [rollout], [[attempt]] = asyncio.run(_state(url, ids))
    assert attempt.attempt_id == running and attempt.status is AttemptStatus.FAILED
    assert "stopped before the attempt finished" in (attempt.error or "")
    assert rollout.status is RolloutStatus.QUEUING  # retried by the next runner, not lost
