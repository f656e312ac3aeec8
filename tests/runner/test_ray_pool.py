"""The Ray runner pool on a local Ray cluster (2 CPUs): real rollouts through the real store server
and the real LLM proxy (LiteLLM engine -> the scripted OpenAI-compatible server of
tests.fixtures, standing in for a model), an actor killed mid-rollout with `ray.kill`, draining,
and the one-line errors of a bad configuration."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.config.schema import RayConfig, RunnerConfig
from alight.errors import ConfigError
from alight.runner.factory import check_pool
from alight.runner.ray_pool import RayRunnerPool
from alight.runner.service import run_pool_until_interrupted
from alight.store.client import StoreClient
from alight.types import Attempt, AttemptStatus, LLMResource, Rollout, RolloutStatus, Span, SpanKind, Task

from .conftest import AGENTS

SERVED_NAME = "policy"


@dataclass
class Servers:
    store_url: str
    proxy_url: str


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """SQLite store server + LLM proxy (LiteLLM engine -> a scripted server answering "4")."""
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore
    from tests.fixtures.openai_server import ScriptedOpenAIServer, answer

    with (
        ScriptedOpenAIServer(lambda request: answer("4")) as upstream,
        StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=0.5) as store_server,
    ):
        engine = LiteLLMEngine(f"openai/{SERVED_NAME}", base_url=upstream.url, served_name=SERVED_NAME)
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            asyncio.run(_publish(store_server.url, proxy_server.url))
            yield Servers(store_server.url, proxy_server.url)
        finally:
            proxy_server.stop()


async def _publish(store_url: str, proxy_url: str) -> None:
    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model=SERVED_NAME)})


async def _enqueue(url: str, tasks: list[Any], **fields: Any) -> list[str]:
    async with StoreClient(url) as client:
        return [r.rollout_id for r in await client.enqueue([Rollout(task=Task(input=t), **fields) for t in tasks])]


async def _ended(url: str, ids: list[str]) -> tuple[list[Rollout], list[list[Attempt]], list[list[Span]]]:
    async with StoreClient(url) as client:
        rollouts = await client.wait_for_rollouts(ids, timeout=60)
        assert len(rollouts) == len(ids), "rollouts did not end in time"
        attempts = [await client.list_attempts(i) for i in ids]
        spans = [await client.query_spans(i) for i in ids]
        return [await client.get_rollout(i) for i in ids], attempts, spans


async def _attempts(url: str, ids: list[str]) -> list[Attempt]:
    async with StoreClient(url) as client:
        return [a for i in ids for a in await client.list_attempts(i)]


async def _spans(url: str, rollout_id: str, attempt_id: str) -> list[Span]:
    async with StoreClient(url) as client:
        return await client.query_spans(rollout_id, attempt_id)


def _ray_pool(url: str, agent: str, n: int = 2, **options: Any) -> RayRunnerPool:
    options.setdefault("instrument", False)
    return RayRunnerPool(f"{AGENTS}:{agent}", url, n_runners=n, ray=RayConfig(num_cpus=0.5), **options)


def _wait_until(condition: Any, timeout_s: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _check_spans(spans: list[Span]) -> None:
    """Each attempt's spans: unique span ids, unique increasing sequence numbers."""
    assert len({s.span_id for s in spans}) == len(spans), "a span is recorded twice"
    sequences = [s.sequence_id for s in spans]
    assert None not in sequences and len(set(sequences)) == len(sequences), sequences


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_ray_actors_run_real_rollouts_through_the_store_and_the_proxy(ray_cluster: Any, servers: Servers) -> None:
    ids = asyncio.run(_enqueue(servers.store_url, [{}] * 6, timeout_s=60))
    # Instrumented, as by default: the agent's openai calls carry their place in the attempt's span order.
    with _ray_pool(servers.store_url, "llm_then_block", instrument=True) as pool:
        rollouts, attempts, spans = asyncio.run(_ended(servers.store_url, ids))
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
    assert [(r.status, r.reward) for r in rollouts] == [(RolloutStatus.SUCCEEDED, 1.0)] * 6
    assert (stats.attempts_succeeded, stats.workers_started, stats.workers_died) == (6, 2, 0)
    workers = {tries[0].worker_id for tries in attempts}
    assert len(workers) == 2 and all(w and w.startswith(pool.pool_id) for w in workers)  # both actors worked
    for rollout_spans in spans:
        _check_spans(rollout_spans)
        llm = [s for s in rollout_spans if s.kind == SpanKind.LLM]
        assert len(llm) == 1 and llm[0].attributes[semconv.LLM_SOURCE] == "proxy"  # the call went through the proxy
        assert [s.attributes[semconv.REWARD_VALUE] for s in rollout_spans if s.kind == SpanKind.REWARD] == [0.5, 1.0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_actor_killed_mid_rollout_fails_its_attempt_which_is_retried_by_a_replacement(
    ray_cluster: Any, servers: Servers, tmp_path: Path
) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    task = {"block_on": [1], "started": str(started), "release": str(release)}
    [rollout_id] = asyncio.run(_enqueue(servers.store_url, [task], max_attempts=2, timeout_s=60))
    pool = _ray_pool(
        servers.store_url, "llm_then_block", n=1, instrument=True, heartbeat_interval_s=0.2, restart_backoff_s=0.1
    )
    with pool:
        attempt_id = _wait_until(lambda: started.exists() and started.read_text(), what="the agent to block")
        # The LLM span (written by the proxy) and the emitted reward (flushed by the heartbeat) are stored.
        before = _wait_until(
            lambda: (s := asyncio.run(_spans(servers.store_url, rollout_id, attempt_id))) and len(s) >= 2 and s,
            what="the first attempt's spans",
        )
        [held] = asyncio.run(_attempts(servers.store_url, [rollout_id]))
        assert held.status is AttemptStatus.RUNNING and held.worker_id is not None
        ray_cluster.kill(ray_cluster.get_actor(f"alight-{held.worker_id}"))

        [rollout], [attempts], _ = asyncio.run(_ended(servers.store_url, [rollout_id]))
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
    first, second = attempts
    assert first.attempt_id == attempt_id and first.status is AttemptStatus.FAILED
    assert "runner actor died" in (first.error or ""), first.error
    assert second.status is AttemptStatus.SUCCEEDED and second.worker_id != first.worker_id
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 1.0
    counts = (stats.workers_died, stats.workers_restarted, stats.attempts_failed, stats.attempts_succeeded)
    assert counts == (1, 1, 1, 1)

    # No span lost or recorded twice: the killed attempt keeps exactly what it had stored before the
    # kill; the retry has its own complete set (an LLM call, the emitted and the final reward).
    by_attempt = {a.attempt_id: asyncio.run(_spans(servers.store_url, rollout_id, a.attempt_id)) for a in attempts}
    for attempt_id_, attempt_spans in by_attempt.items():
        _check_spans(attempt_spans)
        assert {s.attempt_id for s in attempt_spans} == {attempt_id_}
    assert sorted(s.span_id for s in by_attempt[first.attempt_id]) == sorted(s.span_id for s in before)
    retry = by_attempt[second.attempt_id]
    assert [s.kind for s in retry if s.kind in (SpanKind.LLM, SpanKind.REWARD)] == [
        SpanKind.LLM,
        SpanKind.REWARD,
        SpanKind.REWARD,
    ]
    assert not {s.span_id for s in retry} & {s.span_id for s in before}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stop_drains_the_attempts_in_flight_then_fails_what_outlives_the_drain_timeout(
    ray_cluster: Any, store_server: Any
) -> None:
    url = store_server.url
    ids = asyncio.run(_enqueue(url, [{"sleep": 1.5}] * 4))
    pool = _ray_pool(url, "slow").start()

    def two_running() -> list[str] | None:
        running = [a.attempt_id for a in asyncio.run(_attempts(url, ids)) if a.status is AttemptStatus.RUNNING]
        return running if len(running) == 2 else None

    held = _wait_until(two_running, what="two attempts running")
    pool.stop(drain=True)
    assert not pool.running and pool.stats().workers_alive == 0
    attempts = asyncio.run(_attempts(url, ids))
    assert {a.attempt_id: a.status for a in attempts} == dict.fromkeys(held, AttemptStatus.SUCCEEDED)
    assert pool.stats().workers_killed == 0

    # An attempt longer than the drain timeout: its actor is killed, the attempt failed and requeued.
    [stuck] = asyncio.run(_enqueue(url, [{"sleep": 1000}], max_attempts=2))
    pool = _ray_pool(url, "slow", n=1, drain_timeout_s=0.5).start()
    _wait_until(lambda: asyncio.run(_attempts(url, [stuck])), what="the long attempt")
    pool.stop(drain=True)
    [attempt] = asyncio.run(_attempts(url, [stuck]))
    assert attempt.status is AttemptStatus.FAILED and "stopped before the attempt finished" in (attempt.error or "")
    assert pool.stats().workers_killed == 1
    [rollout] = asyncio.run(_state(url, [stuck]))
    assert rollout.status is RolloutStatus.QUEUING  # to be retried, not lost


async def _state(url: str, ids: list[str]) -> list[Rollout]:
    async with StoreClient(url) as client:
        return [await client.get_rollout(i) for i in ids]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_errors_of_a_ray_pool_are_one_line(ray_cluster: Any, store_server: Any) -> None:
    with pytest.raises(ConfigError, match="has no attribute 'no_such_agent'"):
        _ray_pool(store_server.url, "no_such_agent", n=1).start()
    for ray_cfg in (RayConfig(num_cpus=64), RayConfig(resources={"gpu_free_node": 1})):
        pool = RayRunnerPool(f"{AGENTS}:noop", store_server.url, n_runners=1, ray=ray_cfg)
        with pytest.raises(ConfigError, match="no node of the Ray cluster can hold a runner actor") as caught:
            pool.start()
        assert "\n" not in str(caught.value)


def test_a_bad_runner_config_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"runner\.backend must be one of local, ray, got 'k8s'"):
        check_pool(RunnerConfig(backend="k8s"))
    with pytest.raises(ConfigError, match=r"runner\.ray\.num_cpus"):
        check_pool(RunnerConfig(backend="ray", ray=RayConfig(num_cpus=-1)))
    with pytest.raises(ConfigError, match=r"runner\.ray\.address"):
        check_pool(RunnerConfig(backend="ray", ray=RayConfig(address="nowhere")))
    check_pool(RunnerConfig(backend="local"))
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed: `import ray` raises ImportError
    for attempt in (
        lambda: check_pool(RunnerConfig(backend="ray")),
        lambda: run_pool_until_interrupted("m:f", "http://127.0.0.1:1", backend="ray"),
    ):
        with pytest.raises(ConfigError, match=r"needs Ray, which is not installed: pip install 'alight\[ray\]'"):
            attempt()
    check_pool(RunnerConfig(backend="local"))  # the local pool needs no Ray


def test_check_pool_is_cheap_and_the_same_every_time() -> None:
    """The trainer checks the runner config once at load; a check imports no Ray (seconds) and
    changes nothing, so a second call answers as the first."""
    code = """import sys
from alight.config.schema import RayConfig, RunnerConfig
from alight.runner.factory import check_pool
cfg = RunnerConfig(backend="ray", ray=RayConfig(num_cpus=0.5))
check_pool(cfg)
check_pool(cfg)
print("ray" in sys.modules, cfg == RunnerConfig(backend="ray", ray=RayConfig(num_cpus=0.5)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_alight_runner_with_an_unknown_backend_exits_2_with_one_line() -> None:
    command = [sys.executable, "-m", "alight", "runner", "--store", "http://127.0.0.1:1", "--agent", "m:f"]
    done = subprocess.run([*command, "--backend", "k8s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "runner.backend must be one of local, ray, got 'k8s'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_on_alight_runner_with_ray_drains_the_attempts_in_flight(store_server: Any) -> None:
    """`alight runner --backend ray` in its own process group (starting its own local Ray cluster);
    SIGINT to the whole group, as a terminal sends it: the actors finish what they hold."""
    pytest.importorskip("ray")
    url = store_server.url
    ids = asyncio.run(_enqueue(url, [{"sleep": 2.0}] * 4))
    command = [sys.executable, "-m", "alight", "runner", "--store", url, "--agent", f"{AGENTS}:slow", "-n", "2"]
    proc = subprocess.Popen(
        [*command, "--backend", "ray"],
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def two_running() -> list[str] | None:
            assert proc.poll() is None, proc.communicate()
            running = [a.attempt_id for a in asyncio.run(_attempts(url, ids)) if a.status is AttemptStatus.RUNNING]
            return running if len(running) == 2 else None

        held = _wait_until(two_running, timeout_s=240.0, what="two attempts running")  # Ray starts slowly under load
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "attempts succeeded 2, failed 0" in err, err
    attempts = asyncio.run(_attempts(url, ids))
    assert {a.attempt_id: a.status for a in attempts} == dict.fromkeys(held, AttemptStatus.SUCCEEDED)
    assert (
        sorted(r.status for r in asyncio.run(_state(url, ids)))
        == [RolloutStatus.QUEUING] * 2 + [RolloutStatus.SUCCEEDED] * 2
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_actor_whose_agent_blocks_its_event_loop_past_the_timeout_is_killed_and_replaced(
    ray_cluster: Any, store_server: Any
) -> None:
    url = store_server.url
    tasks = [{"fault": "block_loop", "on": [1], "reward": 0.5}]
    [rollout_id] = asyncio.run(_enqueue(url, tasks, max_attempts=2, timeout_s=1.0))
    with _ray_pool(url, "fault_agent", n=1, kill_grace_s=0.5, restart_backoff_s=0.1) as pool:
        [rollout], [attempts], _ = asyncio.run(_ended(url, [rollout_id]))
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
    first, second = attempts
    # Timed out (by the store's watchdog or by the pool, whichever came first); the actor, which
    # could not stop its agent, was killed by the pool and replaced by the one that ran the retry.
    assert first.status is AttemptStatus.TIMEOUT, first
    assert second.status is AttemptStatus.SUCCEEDED and second.worker_id != first.worker_id and rollout.reward == 0.5
    assert (stats.workers_killed, stats.workers_restarted, stats.attempts_timed_out) == (1, 1, 1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_actor_that_stops_answering_is_killed_and_replaced_before_its_attempts_deadline(
    ray_cluster: Any, store_server: Any
) -> None:
    """The backstop for an actor whose event loop is blocked: its long poll goes unanswered past
    EVENT_POLL_S + unresponsive_s, long before the attempt's own deadline (300 s here)."""
    url = store_server.url
    tasks = [{"fault": "block_loop", "on": [1], "reward": 0.5}]
    [rollout_id] = asyncio.run(_enqueue(url, tasks, max_attempts=2, timeout_s=300.0))
    with _ray_pool(url, "fault_agent", n=1, unresponsive_s=0.5, restart_backoff_s=0.1) as pool:
        [rollout], [attempts], _ = asyncio.run(_ended(url, [rollout_id]))
        assert pool.wait_for_idle(timeout_s=30)
        stats = pool.stats()
    first, second = attempts
    assert first.status is AttemptStatus.TIMEOUT and "answered nothing" in (first.error or ""), first
    assert second.status is AttemptStatus.SUCCEEDED and rollout.reward == 0.5
    assert (stats.workers_killed, stats.workers_restarted) == (1, 1)


def test_a_ray_pool_with_the_token_registers_and_its_actors_agents_get_attempt_keys(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """With a token the pool registers a runner credential; its actors claim under that name and
    their agents hold their attempt's key, never the token (tests/runner/agents.py:agent_key_check)."""
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    token = "tok-ray-5e2a"
    with StoreServer(SqliteStore(tmp_path / "store.db"), token=token, watchdog_interval_s=0.5) as server:

        async def enqueue() -> list[str]:
            async with StoreClient(server.url, token=token) as admin:
                await admin.add_resources({"llm": LLMResource(endpoint="http://127.0.0.1:1", model="m")})
                return [r.rollout_id for r in await admin.enqueue([Rollout(task=Task(input={"api_key": token}))])]

        ids = asyncio.run(enqueue())
        with _ray_pool(server.url, "agent_key_check", n=1, token=token) as pool:

            async def ended() -> tuple[Rollout, list[Attempt]]:
                async with StoreClient(server.url, token=token) as admin:
                    [rollout] = await admin.wait_for_rollouts(ids, timeout=60)
                    return rollout, await admin.list_attempts(ids[0])

            rollout, attempts = asyncio.run(ended())
            assert pool.wait_for_idle(timeout_s=30)
    assert (rollout.status, rollout.reward) == (RolloutStatus.SUCCEEDED, 1.0)
    assert str(attempts[0].worker_id).startswith(f"{pool.pool_id}/")
