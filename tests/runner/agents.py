"""Agents the runner tests load by entrypoint (`tests/runner/agents.py:NAME`) in worker processes.

`fault_agent` misbehaves as its task asks, on the attempts the task names, so the outcome of
every rollout is known in advance.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from alight.agent import LitAgent, rollout
from alight.tracing import emit_reward
from alight.types import Attempt


@rollout
async def noop(task: Any) -> float:
    return 1.0


@rollout
async def slow(task: Any) -> float:
    await asyncio.sleep(float(task.get("sleep", 1.0)))
    return 1.0


class Doubler(LitAgent):
    """A class agent: instances pickle, so a pool can take the object instead of an entrypoint."""

    async def rollout(self, task: int) -> float:
        return 2.0 * task


async def _hang() -> None:
    await asyncio.sleep(1000)


async def _block_loop() -> None:
    time.sleep(1000)  # blocks the worker's event loop: only the supervisor can stop it


@rollout
def fault_agent(task: dict[str, Any], attempt: Attempt) -> Any:
    """A sync agent (it runs in a thread); `task["fault"]` happens on `task["on"]` attempts."""
    fault = task.get("fault")
    if fault and attempt.number in task.get("on", [1]):
        if fault == "raise":
            raise ValueError(f"fault injected on attempt {attempt.number}")
        if fault == "sync_hang":
            time.sleep(1000)
        if fault == "async_hang":
            return _hang()  # LitAgent.run awaits what a sync agent returns: a hang on the event loop
        if fault == "block_loop":
            return _block_loop()
        if fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    if task.get("emit") is not None:
        emit_reward(float(task["emit"]))
        return None
    return float(task.get("reward", 1.0))


@rollout
async def api_key_check(task: Any, llm: Any) -> float:
    """1.0 when the LLM the runner bound carries the api key the task expects (the run's token)."""
    return 1.0 if llm.api_key == task["api_key"] else 0.0


@rollout
async def agent_key_check(task: Any, llm: Any) -> float:
    """1.0 when the LLM carries an agent key (not the token the task names) and no secret of the
    runner is in this process's environment."""
    import os

    secrets = {name: os.environ.get(name) for name in ("ALIGHT_TOKEN", "ALIGHT_RUNNER_CREDENTIAL")}
    clean = not any(secrets.values()) and task["api_key"] not in os.environ.values()
    return 1.0 if clean and llm.api_key.startswith("ala.") and llm.api_key != task["api_key"] else 0.0


@rollout
async def llm_then_block(task: dict[str, Any], llm: Any, attempt: Attempt) -> float:
    """One LLM call through the proxy and an emitted reward; on the attempts `task["block_on"]`
    names it then writes its attempt id to `task["started"]` and waits for `task["release"]` to
    exist, so a test can kill its runner mid-rollout."""
    import openai

    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key or "none")
    reply = await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "2 + 2?"}])
    emit_reward(0.5, name="asked")
    if attempt.number in task.get("block_on", []):
        Path(task["started"]).write_text(attempt.attempt_id)
        while not Path(task["release"]).exists():
            await asyncio.sleep(0.05)
    return 1.0 if reply.choices[0].message.content else 0.0
