"""Raw HTTP clients (httpx sync and async, requests, aiohttp, urllib) get alight's proxy headers.

The fast tests send real requests to the scripted OpenAI server on loopback (it records what it
received) from inside a traced attempt. The slow test runs a raw-HTTP agent with each client
through the real runner pool, the real proxy (a scripted engine behind it) and a real store
server, and checks what the adapter selects from the stored spans.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from alight import semconv
from alight.adapters.adapter import SpanAdapter
from alight.proxy import Proxy, ProxyServer
from alight.runner import RunnerPool
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.tracing import http_clients, make_tracer
from alight.tracing.context import current_frame
from alight.types import LLMResource, Rollout, RolloutStatus, Span, SpanKind, Task
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.raw_http_agents import CLIENTS, post
from tests.proxy.scripted import ScriptedEngine
from tests.tracing.conftest import new_claim

ALIGHT_HEADERS = (
    semconv.HEADER_AGENT_NAME,
    semconv.HEADER_SEQUENCE_ID,
    semconv.HEADER_PARENT_SPAN_ID,
    semconv.HEADER_TRACE_ID,
)
LLM_MESSAGES = semconv.LLM_REQUEST_MESSAGES
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as server:
        yield server


@dataclass
class Attempt:
    rollout_id: str
    attempt_id: str
    parent_span_id: str
    trace_id: str
    next_sequence_id: Any


@pytest.fixture
async def attempt() -> AsyncIterator[Attempt]:
    """A traced attempt of agent "writer" (the runner's tracer, the hooks installed)."""
    tracer = make_tracer("light")
    tracer.instrument()
    store = MemoryStore()
    claim = await new_claim(store)
    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="writer") as ctx:
        frame = current_frame()
        assert frame is not None and frame.parent is not None
        yield Attempt(
            claim.rollout.rollout_id,
            claim.attempt.attempt_id,
            frame.parent.span_id,
            frame.parent.trace_id,
            ctx.next_sequence_id,
        )


def alight_headers(server: ScriptedOpenAIServer) -> dict[str, str]:
    """The alight headers of the last request the server got."""
    headers = server.requests[-1].headers
    return {name: headers[name] for name in ALIGHT_HEADERS if name in headers}


@pytest.mark.anyio
@pytest.mark.parametrize("client", list(CLIENTS))
async def test_requests_to_a_proxy_route_get_the_headers(
    client: str, server: ScriptedOpenAIServer, attempt: Attempt
) -> None:
    route = f"{server.proxy_url(attempt.rollout_id, attempt.attempt_id)}/chat/completions"
    expected = {
        semconv.HEADER_AGENT_NAME: "writer",
        semconv.HEADER_PARENT_SPAN_ID: attempt.parent_span_id,
        semconv.HEADER_TRACE_ID: attempt.trace_id,
    }
    # The attempt's AGENT span holds sequence id 1: calls take 2, 3, ...
    await post(client, route, BODY)
    assert alight_headers(server) == {**expected, semconv.HEADER_SEQUENCE_ID: "2"}
    await post(client, route, BODY)
    assert alight_headers(server) == {**expected, semconv.HEADER_SEQUENCE_ID: "3"}
    # The proxy's plain /v1 route, the attempt named in headers: numbered too.
    ids = {semconv.HEADER_ROLLOUT_ID: attempt.rollout_id, semconv.HEADER_ATTEMPT_ID: attempt.attempt_id}
    await post(client, f"{server.url}/chat/completions", BODY, ids)
    assert alight_headers(server) == {**expected, semconv.HEADER_SEQUENCE_ID: "4"}
    # The caller's own agent name wins; the rest is filled in.
    await post(client, route, BODY, {semconv.HEADER_AGENT_NAME: "critic"})
    assert alight_headers(server) == {**expected, semconv.HEADER_AGENT_NAME: "critic", semconv.HEADER_SEQUENCE_ID: "5"}
    # Numbered already (an SDK's own instrumentation): left alone, no number taken.
    await post(client, route, BODY, {semconv.HEADER_SEQUENCE_ID: "41"})
    assert alight_headers(server) == {semconv.HEADER_SEQUENCE_ID: "41"}
    # Not an alight proxy: nothing added, no number taken.
    await post(client, f"{server.url}/chat/completions", BODY)
    assert alight_headers(server) == {}
    assert attempt.next_sequence_id() == 6


@pytest.mark.anyio
@pytest.mark.parametrize("client", list(CLIENTS))
async def test_no_headers_outside_an_attempt(client: str, server: ScriptedOpenAIServer) -> None:
    make_tracer("light").instrument()
    assert current_frame() is None
    await post(client, f"{server.proxy_url('ro-1', 'at-1')}/chat/completions", BODY)
    assert alight_headers(server) == {}


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_the_openai_sdk_takes_one_sequence_number_per_call(
    sync: bool, server: ScriptedOpenAIServer, attempt: Attempt
) -> None:
    import openai

    base_url = server.proxy_url(attempt.rollout_id, attempt.attempt_id)
    messages: Any = [{"role": "user", "content": "hi"}]
    numbers = []
    for _ in range(3):
        if sync:
            with openai.OpenAI(base_url=base_url, api_key="x") as client:
                await asyncio.to_thread(client.chat.completions.create, model="m", messages=messages)
        else:
            # closed here: one left to the garbage collector closes itself on a later test's event loop
            async with openai.AsyncOpenAI(base_url=base_url, api_key="x") as aclient:
                await aclient.chat.completions.create(model="m", messages=messages)
        numbers.append(alight_headers(server)[semconv.HEADER_SEQUENCE_ID])
    assert numbers == ["2", "3", "4"]  # the SDK's numbers, the httpx hook adding none
    assert attempt.next_sequence_id() == 5
    assert alight_headers(server)[semconv.HEADER_AGENT_NAME] == "writer"


@pytest.mark.anyio
@pytest.mark.parametrize("client", list(CLIENTS))
async def test_a_failing_hook_never_breaks_the_request(
    client: str,
    server: ScriptedOpenAIServer,
    attempt: Attempt,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("hook bug")

    monkeypatch.setattr(http_clients, "proxy_headers", broken)
    with caplog.at_level(logging.WARNING, logger="alight.tracing.http_clients"):
        answer = await post(
            client, f"{server.proxy_url(attempt.rollout_id, attempt.attempt_id)}/chat/completions", BODY
        )
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert alight_headers(server) == {}
    assert "could not add its proxy headers" in caplog.text


# -- through the runner pool and the proxy ------------------------------------------------------


async def _run_rollouts(store_url: str, clients: list[str]) -> list[tuple[Rollout, list[Span]]]:
    async with StoreClient(store_url) as store:
        rollouts = [Rollout(task=Task(input={"client": c, "question": "Hi?"}), timeout_s=60) for c in clients]
        ids = [r.rollout_id for r in await store.enqueue(rollouts)]
        ended = await store.wait_for_rollouts(ids, timeout=120)
        assert len(ended) == len(ids), "rollouts did not end in time"
        return [(await store.get_rollout(i), await store.query_spans(i)) for i in ids]


async def _publish(store_url: str, proxy_url: str) -> None:
    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model="scripted")})


@pytest.mark.slow
def test_raw_http_agents_through_the_pool_nest_under_their_agent() -> None:
    clients = list(CLIENTS)
    with (
        StoreServer(MemoryStore(), watchdog_interval_s=None) as store_server,
        ProxyServer(Proxy(ScriptedEngine(), StoreClient(store_server.url))) as proxy_server,
    ):
        asyncio.run(_publish(store_server.url, proxy_server.url))
        with RunnerPool("tests.fixtures.raw_http_agents:writer", store_server.url, n_runners=2):
            runs = asyncio.run(_run_rollouts(store_server.url, clients))
        proxy_server.flush()
        runs = [(rollout, asyncio.run(_spans(store_server.url, rollout.rollout_id))) for rollout, _ in runs]
    writer, nobody = SpanAdapter(agent_match="writer"), SpanAdapter(agent_match="reader|critic")
    for client, (rollout, spans) in zip(clients, runs, strict=True):
        assert rollout.status == RolloutStatus.SUCCEEDED and rollout.reward == 1.0, (client, rollout)
        [agent] = [s for s in spans if s.kind == SpanKind.AGENT]
        llm = sorted(
            (s for s in spans if s.kind == SpanKind.LLM), key=lambda s: len(s.attributes[semconv.LLM_REQUEST_MESSAGES])
        )
        assert len(llm) == 2, client
        for span in llm:
            assert span.attributes[semconv.LLM_SOURCE] == "proxy"
            assert span.attributes[semconv.AGENT_NAME] == "writer", client
            assert span.parent_id == agent.span_id and span.trace_id == agent.trace_id, client
        sequence = [agent.sequence_id] + [s.sequence_id for s in llm]  # agent span, first call, follow-up
        assert sequence == sorted(sequence) and len(set(sequence)) == 3, (client, sequence)
        adapted = writer.adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward)
        assert [t.agent_name for t in adapted.transitions] == ["writer", "writer"], client
        assert [t.span_id for t in adapted.transitions] == [s.span_id for s in llm]
        assert nobody.adapt(spans, rollout_id=rollout.rollout_id, reward=rollout.reward).transitions == []


async def _spans(store_url: str, rollout_id: str) -> list[Span]:
    async with StoreClient(store_url) as store:
        return await store.query_spans(rollout_id)
