"""The agents runner_bench.py runs (loaded by the pools as `benchmarks/runner_agents.py:NAME`)."""

from __future__ import annotations

import asyncio
from typing import Any

from alight.agent import rollout


@rollout
async def noop(task: Any) -> float:
    """Returns at once: what a runner and the store cost per rollout."""
    return 1.0


@rollout
async def sleep(task: dict[str, Any]) -> float:
    """Waits `task["sleep"]` seconds, as an agent waiting on tools or an LLM does (I/O-bound)."""
    await asyncio.sleep(float(task["sleep"]))
    return 1.0
