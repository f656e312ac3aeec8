"""Real vLLM (its CPU build) behind alight: a server started by someone else, reached by URL; sleep
and wake; weights reloaded with calls in flight through the real proxy, gate and store, each call's
span recording the version that served it and the log-probs of those weights. The server is the
session's `real_vllm` (tests/engines/conftest.py) on the tiny model; what a test changes it puts back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from alight import semconv
from alight.engines.base import ChatRequest, CompletionRequest, Engine, Generation, SamplingParams
from alight.engines.vllm_engine import VLLMEngine
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.engines.test_engine_conformance import MESSAGES, assert_log_probs_match, forward_log_probs
from tests.proxy.conftest import new_attempt, spans_of

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.slow]


class Borrowed(Engine):
    """The session's engine lent to a proxy, which starts and closes what it is given: not this one."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.inner = engine
        self.name = engine.name

    @property
    def model_names(self) -> list[str]:
        return self.inner.model_names

    @property
    def weights_version(self) -> int | None:
        return self.inner.weights_version

    async def chat(self, request: ChatRequest) -> Generation:
        return await self.inner.chat(request)

    async def complete(self, request: CompletionRequest) -> Generation:
        return await self.inner.complete(request)

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        await self.inner.update_weights(weights, version)

    async def sleep(self) -> None:
        await self.inner.sleep()

    async def wake_up(self) -> None:
        await self.inner.wake_up()

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[Any]:  # pragma: no cover - unused
        yield await self.chat(request)


async def test_a_server_reached_by_url_is_called_by_the_name_it_serves(real_vllm: VLLMEngine) -> None:
    """The agents' name ("policy") is not the server's ("tiny"): the engine asks the server what it serves."""
    remote = VLLMEngine(base_url=f"{real_vllm.server_root}/v1", served_name="policy")
    await remote.start()
    out = await remote.chat(ChatRequest(model="policy", messages=MESSAGES, sampling=SamplingParams(0.0, max_tokens=3)))
    assert out.response_token_ids and out.model == "policy"


async def test_sleep_pauses_the_server_and_wake_up_resumes_it(real_vllm: VLLMEngine) -> None:
    """On the CPU build sleep frees nothing (no accelerator) but pauses the server, as on a GPU."""
    await real_vllm.sleep()
    try:
        assert real_vllm.asleep
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{real_vllm.server_root}/is_sleeping")).json() == {"is_sleeping": True}
    finally:
        await real_vllm.wake_up()
    assert not real_vllm.asleep
    out = await real_vllm.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=SamplingParams(0.0, max_tokens=3)))
    assert out.response_token_ids


def test_weights_reload_with_calls_in_flight(real_vllm: VLLMEngine, hostile_tiny: Path) -> None:
    """Async training's version switch on real vLLM: calls keep coming while new weights load; every
    call is answered, its span records the version that served it, and its log-probs are those of
    that version's weights (the new ones differ enough to tell)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    original = load_file(str(hostile_tiny / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    models = {}
    for version, state in ((0, original), (1, changed)):
        model = AutoModelForCausalLM.from_pretrained(hostile_tiny, dtype="float32")
        model.load_state_dict(state, strict=False)
        model.tie_weights()
        models[version] = model.eval()

    proxy = Proxy(Borrowed(real_vllm), MemoryStore(), version=0)
    answered: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    with ProxyServer(proxy) as server:
        stop = threading.Event()

        def caller() -> None:
            while not stop.is_set():
                rid, aid = new_attempt(server)
                client = openai.OpenAI(api_key="x", max_retries=0, timeout=120, base_url=server.base_url(rid, aid))
                try:
                    client.chat.completions.create(
                        model="tiny",
                        messages=MESSAGES,
                        max_tokens=8,
                        temperature=1.0,  # type: ignore[arg-type]
                    )
                    answered.append((rid, aid))
                except BaseException as err:  # the test fails on any
                    errors.append(err)

        threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        while len(answered) < 4 and not errors:
            threading.Event().wait(0.05)
        try:
            server.update_weights(changed, 1)
            before = len(answered)
            while len(answered) < before + 4 and not errors:
                threading.Event().wait(0.05)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
            server.update_weights(str(hostile_tiny), 2)  # the session's server gets its weights back
        assert not errors, errors
        spans = [span for rid, _ in answered for span in spans_of(server, rid)]
    versions = [span.attributes[semconv.RESOURCES_VERSION] for span in spans]
    assert set(versions) == {0, 1}, versions
    for span in spans:
        a = span.attributes
        version = a[semconv.RESOURCES_VERSION]
        prompt, response = a[semconv.LLM_PROMPT_TOKEN_IDS], a[semconv.LLM_RESPONSE_TOKEN_IDS]
        assert_log_probs_match(
            a[semconv.LLM_RESPONSE_LOGPROBS], forward_log_probs(models[version], prompt, response, 1.0)
        )
        other = forward_log_probs(models[1 - version], prompt, response, 1.0)
        assert max(abs(x - y) for x, y in zip(a[semconv.LLM_RESPONSE_LOGPROBS], other, strict=True)) > 0.01
        assert a[semconv.LLM_ENGINE_SAMPLING]["top_k"] == -1
    back = asyncio.run(real_vllm.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=SamplingParams(0.0))))
    assert back.weights_version == 2
