"""Least privilege through the real stack: a store server with a token, the LLM proxy (which asks
the store what an agent key opens), a runner pool that registers with the token, and a command
agent that cheats (tests/integration/adversary_agent.py). Every forbidden call it makes with the
key it was given is refused (401/403) and changes nothing in the store; its own model call works
and is recorded. The model is the scripted engine: no model runs here."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from alight.command_agent import CommandAgent
from alight.proxy import Proxy, ProxyServer
from alight.runner.pool import RunnerPool
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, LLMResource, Rollout, RolloutStatus, Span, SpanKind, Task
from tests.proxy.scripted import ScriptedEngine

TOKEN = "tok-least-privilege-7c4b1e"
AGENT = Path(__file__).with_name("adversary_agent.py")


async def _dump(store: StoreClient, rollout_id: str) -> list[Any]:
    """All the store holds about `rollout_id`, and the resources."""
    return [
        await store.get_rollout(rollout_id),
        await store.list_attempts(rollout_id),
        await store.span_dicts([rollout_id], all_attempts=True),
        await store.get_latest_resources(),
    ]


def test_a_cheating_command_agent_gets_only_its_own_model_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)  # the pool finds it here; its agents must never see it
    out = tmp_path / "tried.json"
    with StoreServer(SqliteStore(tmp_path / "store.db"), token=TOKEN, watchdog_interval_s=0.5) as store_server:
        proxy_store = StoreClient(store_server.url, token=TOKEN)
        proxy = ProxyServer(
            Proxy(ScriptedEngine(), proxy_store), token=TOKEN, resolve=proxy_store.check_credential
        ).start()
        try:
            victim, before, attacker_id = asyncio.run(_set_up(store_server.url, proxy.url, out))
            agent = CommandAgent([sys.executable, str(AGENT)], name="adversary")
            with RunnerPool(agent, store_server.url, n_runners=1, instrument=False, heartbeat_interval_s=0.5):
                after, attacker = asyncio.run(_after(store_server.url, victim, attacker_id))
        finally:
            proxy.stop()
    report = json.loads(out.read_text())
    refused = {what: status for what, status in report["tried"].items() if status in (401, 403)}
    assert refused == report["tried"], {k: v for k, v in report["tried"].items() if k not in refused}
    assert len(refused) == 44 and refused["no key"] == refused["a changed key"] == 401
    assert report["secrets"] == [] and report["key_prefix"] == "ala."
    assert report["own_call"] == 200
    assert after == before  # the victim's rollout, attempts, spans and the resources: unchanged
    rollout, spans = attacker
    assert rollout.status == RolloutStatus.SUCCEEDED and rollout.reward == 0.5  # what it printed, not 99
    assert [span.kind for span in spans].count(SpanKind.LLM) == 1  # its own call, recorded
    assert not any(span.name == "forged" or span.attributes.get("alight.reward.value") == 99.0 for span in spans)


async def _set_up(store_url: str, proxy_url: str, out: Path) -> tuple[tuple[str, str, str], list[Any], str]:
    """A victim rollout held by another runner (with a span of its own), then the attacker's rollout."""
    async with StoreClient(store_url, token=TOKEN) as admin:
        await admin.add_resources({"llm": LLMResource(endpoint=proxy_url, model="scripted")})
        victim_key = await admin.register_runner("victim")
        [victim] = await admin.enqueue([Rollout(task=Task(input="v"), timeout_s=600.0)])
        async with StoreClient(store_url, token=victim_key) as runner:
            claim = await runner.dequeue()
            assert claim is not None
            await runner.start_attempt(claim.attempt.attempt_id)
            await runner.add_spans([Span(rollout_id=victim.rollout_id, attempt_id=claim.attempt.attempt_id, name="v")])
        before = await _dump(admin, victim.rollout_id)
        task = {
            "victim_rollout": victim.rollout_id,
            "victim_attempt": claim.attempt.attempt_id,
            "victim_runner": "victim",
            "admin_token": TOKEN,
            "out": str(out),
        }
        [attacker] = await admin.enqueue([Rollout(task=Task(input=task), timeout_s=120.0)])
        return (victim.rollout_id, claim.attempt.attempt_id, victim_key), before, attacker.rollout_id


async def _after(store_url: str, victim: tuple[str, str, str], attacker_id: str) -> tuple[list[Any], Any]:
    async with StoreClient(store_url, token=TOKEN) as admin:
        deadline = time.monotonic() + 120
        while (rollout := await admin.get_rollout(attacker_id)).status in (
            RolloutStatus.QUEUING,
            RolloutStatus.RUNNING,
        ):
            assert time.monotonic() < deadline, "the attacker's rollout did not end"
            await asyncio.sleep(0.2)  # the victim's attempt needs no heartbeat in that time (60 s)
        after = await _dump(admin, victim[0])
        spans = await admin.query_spans(attacker_id)
        async with StoreClient(store_url, token=victim[2]) as runner:
            await runner.finish_attempt(victim[1], AttemptStatus.SUCCEEDED, reward=0.0)
        return after, (rollout, spans)
