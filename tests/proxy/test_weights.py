"""Weight updates through the proxy: pause, drain, swap, resume; every span carries the version
whose weights produced it (checked against a forward pass of those weights)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

torch = pytest.importorskip("torch")

MESSAGES = [{"role": "user", "content": "Tell me something."}]


@pytest.fixture
def server(tiny_dir: Path) -> Iterator[ProxyServer]:
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=16, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore(), version=1), admin=True) as proxy_server:
        yield proxy_server


def _noisy(state: dict[str, Any], seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in state.items()}


def _forward(model: Any, state: dict[str, Any], prompt: list[int], response: list[int]) -> Any:
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def _check_versions(spans: list[Any], weights: dict[int, dict[str, Any]], tiny_dir: Path) -> None:
    """Each span's log-probs are those of its version's weights, and not of any other version's.
    (Batched calls are left-padded: numerics differ from a lone forward pass by up to ~1e-3.)"""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    for span in spans:
        a = span.attributes
        got = torch.tensor(a[semconv.LLM_RESPONSE_LOGPROBS])
        ids = a[semconv.LLM_PROMPT_TOKEN_IDS], a[semconv.LLM_RESPONSE_TOKEN_IDS]
        for version, state in weights.items():
            matches = torch.allclose(got, _forward(model, state, *ids), atol=2e-3)
            assert matches == (version == a[semconv.RESOURCES_VERSION]), (span.span_id, version)


@pytest.mark.anyio
async def test_the_next_call_uses_the_new_weights_and_carries_the_new_version(
    server: ProxyServer, tiny_dir: Path
) -> None:
    rid, aid = new_attempt(server)
    async with openai.AsyncOpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0) as llm:
        original = {k: v.clone() for k, v in server.proxy.engine.model.state_dict().items()}  # type: ignore[attr-defined]
        before = await llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        noisy = _noisy(original, 0)
        await server.proxy.update_weights(noisy, 2)  # from the trainer's loop, not the proxy's
        assert server.proxy.version == 2
        after = await llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        assert after.choices[0].message.content != before.choices[0].message.content
        first, second = spans_of(server, rid)
        assert (first.attributes[semconv.RESOURCES_VERSION], second.attributes[semconv.RESOURCES_VERSION]) == (1, 2)
        _check_versions([first, second], {1: original, 2: noisy}, tiny_dir)


@pytest.mark.anyio
async def test_calls_in_flight_during_an_update_all_succeed_on_one_version(server: ProxyServer, tiny_dir: Path) -> None:
    rid, aid = new_attempt(server)
    async with openai.AsyncOpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0) as llm:
        original = {k: v.clone() for k, v in server.proxy.engine.model.state_dict().items()}  # type: ignore[attr-defined]
        noisy = _noisy(original, 1)

        async def ask(i: int, stream: bool) -> str:
            kwargs: dict[str, Any] = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 16,
            }
            if not stream:
                return (await llm.chat.completions.create(**kwargs)).choices[0].message.content or ""
            chunks = await llm.chat.completions.create(**kwargs, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

        early = [asyncio.create_task(ask(i, stream=i % 2 == 0)) for i in range(4)]
        deadline = time.monotonic() + 10
        # all four inside the gate before the update starts (an int read across threads)
        while server.proxy.gate.in_flight < len(early) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        update = asyncio.create_task(server.proxy.update_weights(noisy, 2))
        while not server.proxy.gate.paused and not update.done():
            await asyncio.sleep(0.001)
        late = [asyncio.create_task(ask(i, stream=i % 2 == 0)) for i in range(4, 8)]
        await asyncio.gather(update, *early, *late)  # nothing fails

        spans = spans_of(server, rid)
        assert len(spans) == 8 and all(s.status == "ok" for s in spans)
        versions = {
            s.attributes[semconv.LLM_REQUEST_MESSAGES][0]["content"]: s.attributes[semconv.RESOURCES_VERSION]
            for s in spans
        }
        assert [versions[f"q{i}"] for i in range(8)] == [1] * 4 + [2] * 4
        _check_versions(spans, {1: original, 2: noisy}, tiny_dir)


def test_admin_route_loads_a_checkpoint(server: ProxyServer, tiny_dir: Path) -> None:
    answer = httpx.post(server.url + "/admin/weights", json={"checkpoint": str(tiny_dir), "version": 5}, timeout=60)
    assert answer.status_code == 200 and answer.json() == {"version": 5}
    assert httpx.get(server.url + "/health").json()["version"] == 5
    bad = httpx.post(server.url + "/admin/weights", json={"checkpoint": "/nonexistent", "version": 6}, timeout=60)
    assert bad.status_code == 400 and "nonexistent" in bad.json()["error"]["message"]
    assert server.proxy.version == 5


def test_a_client_that_leaves_mid_stream_does_not_block_updates(server: ProxyServer) -> None:
    rid, aid = new_attempt(server)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "stream": True}
    with httpx.stream("POST", server.base_url(rid, aid) + "/chat/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")  # then hang up
    state = {k: v.clone() for k, v in server.proxy.engine.model.state_dict().items()}  # type: ignore[attr-defined]
    server.update_weights(state, 3, timeout_s=30)
    assert server.proxy.version == 3 and server.proxy.gate.in_flight == 0
    [span] = spans_of(server, rid)
    assert span.attributes[semconv.RESOURCES_VERSION] == 1 and span.attributes[semconv.LLM_STREAM] is True
