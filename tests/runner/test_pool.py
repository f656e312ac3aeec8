"""RunnerPool start-up: agents given as objects or entrypoints, and the errors a user can make."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alight import semconv
from alight.agent_setup import runner_agent, runner_command
from alight.config.schema import AgentConfig
from alight.errors import ConfigError
from alight.runner import RunnerPool
from alight.store.client import StoreClient
from alight.types import Rollout, RolloutStatus, Task

from . import agents
from .conftest import AGENTS


async def _run(url: str, inputs: list[Any]) -> list[Rollout]:
    async with StoreClient(url) as client:
        ids = [r.rollout_id for r in await client.enqueue([Rollout(task=Task(input=i)) for i in inputs])]
        return await client.wait_for_rollouts(ids, timeout=60)


@pytest.mark.slow
def test_a_picklable_agent_object_runs_in_the_workers(store_server: Any) -> None:
    with RunnerPool(agents.Doubler(), store_server.url, n_runners=1, instrument=False) as pool:
        done = asyncio.run(_run(store_server.url, [1, 2, 3]))
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
    assert sorted((r.status, r.reward) for r in done) == [(RolloutStatus.SUCCEEDED, x) for x in (2.0, 4.0, 6.0)]
    assert (stats.attempts_succeeded, stats.workers_started, stats.workers_busy) == (3, 1, 0)


@pytest.mark.slow
def test_an_agent_that_cannot_load_fails_start_with_its_one_line_error(store_server: Any) -> None:
    pool = RunnerPool(f"{AGENTS}:no_such_agent", store_server.url, n_runners=2, instrument=False)
    with pytest.raises(ConfigError, match="has no attribute 'no_such_agent'"):
        pool.start()
    assert not pool.running


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="cannot be sent to worker processes"):
        RunnerPool(agents.noop, "http://127.0.0.1:1")  # a decorated function does not pickle
    with pytest.raises(ConfigError, match="n_runners"):
        RunnerPool("m:f", "http://127.0.0.1:1", n_runners=0)
    with pytest.raises(ConfigError, match="unknown tracer"):
        RunnerPool("m:f", "http://127.0.0.1:1", tracer="zipkin")
    with pytest.raises(ConfigError, match="store URL"):
        RunnerPool("m:f", "127.0.0.1:1")


@pytest.mark.slow
def test_an_entrypoint_agent_runs_under_the_configured_agent_name(store_server: Any) -> None:
    """`agent.name` names an entrypoint agent's spans in the workers (it used to be dropped)."""
    agent = runner_agent(AgentConfig(entrypoint=f"{AGENTS}:fault_agent", name="writer"))
    assert runner_command(agent) == f"--agent {AGENTS}:fault_agent --name writer"

    async def run() -> list[Any]:
        async with StoreClient(store_server.url) as client:
            [queued] = await client.enqueue([Rollout(task=Task(input={"emit": 0.5}))])
            [done] = await client.wait_for_rollouts([queued.rollout_id], timeout=60)
            assert (done.status, done.reward) == (RolloutStatus.SUCCEEDED, 0.5)
            return await client.query_spans(done.rollout_id)

    with RunnerPool(agent, store_server.url, n_runners=1):
        spans = asyncio.run(run())
    assert [(s.kind.value, s.name) for s in spans] == [("agent", "writer"), ("reward", "reward")]
    assert {s.attributes.get(semconv.AGENT_NAME) for s in spans if s.kind.value == "agent"} == {"writer"}


@pytest.mark.slow
@pytest.mark.parametrize("tracer", ["light", "otel"])
def test_workers_with_the_default_instrumentation_record_the_agents_spans(store_server: Any, tracer: str) -> None:
    async def run() -> list[Any]:
        async with StoreClient(store_server.url) as client:
            [queued] = await client.enqueue([Rollout(task=Task(input={"emit": 0.75}))])
            [done] = await client.wait_for_rollouts([queued.rollout_id], timeout=60)
            assert (done.status, done.reward) == (RolloutStatus.SUCCEEDED, 0.75)
            return await client.query_spans(done.rollout_id)

    with RunnerPool(f"{AGENTS}:fault_agent", store_server.url, n_runners=1, tracer=tracer):
        spans = asyncio.run(run())
    assert [(s.kind.value, s.name) for s in spans] == [("agent", "fault_agent"), ("reward", "reward")]
