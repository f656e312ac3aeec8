"""An uninstrumented runner (`instrument=False`): the agent's model calls reach the real proxy with no
sequence number, so the store numbers their spans as they arrive; the attempt's own spans (its agent
span, its rewards) must not reuse those numbers (they used to: two spans with one `sequence_id`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from alight.agent import LLM, rollout
from alight.proxy import Proxy
from alight.proxy.server import ProxyServer
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.tracing import emit_reward, make_tracer
from alight.types import LLMResource, Rollout, RolloutStatus, SpanKind, Task
from tests.proxy.scripted import ScriptedEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[StoreServer, ProxyServer]]:
    with StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=None) as store_server:
        proxy_server = ProxyServer(Proxy(ScriptedEngine(), StoreClient(store_server.url))).start()
        try:
            yield store_server, proxy_server
        finally:
            proxy_server.stop()


def _call_and_wait_for_its_span(llm: LLM, store_url: str, rollout_id: str, recorded: int) -> None:
    """One chat call from a fresh thread (no attempt context there, so no instrumentation can
    number it, whatever this process hooked before), then wait until the proxy stored its span."""

    def call() -> None:
        body = {"model": llm.model, "messages": [{"role": "user", "content": "2+3?"}]}
        assert httpx.post(f"{llm.base_url}/chat/completions", json=body, timeout=30).status_code == 200

    caller = threading.Thread(target=call)
    caller.start()
    caller.join()
    deadline = time.monotonic() + 20
    while True:
        spans = httpx.get(f"{store_url}/store/rollouts/{rollout_id}/spans", timeout=10).json()
        if sum(span["kind"] == "llm" for span in spans) > recorded:
            return
        assert time.monotonic() < deadline, "the proxy did not store the call's span"
        time.sleep(0.05)


async def test_an_uninstrumented_attempt_never_reuses_a_sequence_id(
    servers: tuple[StoreServer, ProxyServer],
) -> None:
    from alight.runner import Runner

    store_server, proxy_server = servers

    @rollout
    def agent(llm: LLM, rollout: Any) -> float:
        for recorded in range(2):
            _call_and_wait_for_its_span(llm, store_server.url, rollout.rollout_id, recorded)
            emit_reward(0.5, name="step")
        return 1.0

    async with StoreClient(store_server.url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_server.url, model="scripted")})
        [queued] = await store.enqueue([Rollout(task=Task(input={}))])
        runner = Runner(agent, store, tracer=make_tracer("light"), instrument=False, heartbeat_interval_s=0.2)
        assert await runner.run(max_rollouts=1, idle_exit_s=1.0) == 1
        done = await store.get_rollout(queued.rollout_id)
        assert (done.status, done.reward) == (RolloutStatus.SUCCEEDED, 1.0)
        spans = await store.query_spans(queued.rollout_id)
    numbers = [span.sequence_id for span in spans]
    assert len(set(numbers)) == len(numbers) == 6, numbers  # 2 model calls, 2 step rewards, final reward, agent
    kinds = [span.kind for span in spans]
    assert sorted(kinds) == sorted([SpanKind.LLM] * 2 + [SpanKind.REWARD] * 3 + [SpanKind.AGENT])
    # Numbered as they were written: the first call before anything the attempt flushed, the
    # attempt's root span last (a step reward may be flushed between the calls, or after both).
    assert kinds[0] is SpanKind.LLM and kinds[-2:] == [SpanKind.REWARD, SpanKind.AGENT]
