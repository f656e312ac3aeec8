"""The store server and the LLM proxy serve again, on the same port, when uvicorn stops without
being asked: what they hold lives on (the store's data, the engine with the weights of the last
update), clients retry into them, each restart is counted, and past the budget the server stays
down and says why."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.restarts import RestartPolicy
from alight.serving.background import BackgroundServer
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.types import Rollout, Task
from tests.proxy.conftest import new_attempt, spans_of

MESSAGES = [{"role": "user", "content": "Tell me something."}]


def _stop_unasked(server: BackgroundServer) -> None:
    """What a crash of uvicorn's serving looks like from outside: it ends, nobody called stop()."""
    assert server._server is not None
    server._server.should_exit = True


def _wait(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_store_server_serves_again_with_its_data_and_a_client_retries_into_it() -> None:
    store = MemoryStore()
    with StoreServer(store, port=0) as server:

        async def enqueue() -> str:
            async with StoreClient(server.url) as client:
                [rollout] = await client.enqueue([Rollout(task=Task(input="x"))])
                return rollout.rollout_id

        rollout_id = asyncio.run(enqueue())
        port = server.port
        _stop_unasked(server)
        _wait(lambda: server.restarts == 1)

        async def read() -> list[str]:
            async with StoreClient(server.url) as client:  # its retries span the moment it is down
                return [r.rollout_id for r in await client.list_rollouts()]

        assert asyncio.run(read()) == [rollout_id]  # the same store, not closed and reopened
        assert server.port == port and server.failure is None


@pytest.mark.anyio
async def test_a_proxy_serves_again_on_the_weights_of_the_last_update(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind it the stand-in vLLM server (tests/engines/fake_vllm.py), whose answers name the digest
    of the weights it serves: a proxy that closed and started its engine again would serve the
    model's original weights."""
    from safetensors.torch import load_file

    from alight.engines import vllm_engine
    from alight.engines.vllm_engine import VLLMEngine
    from alight.engines.vllm_server import VLLMLauncher

    script = Path(__file__).parents[1] / "engines" / "fake_vllm.py"
    monkeypatch.setattr(vllm_engine, "find_vllm", lambda *a, **k: VLLMLauncher((sys.executable, str(script)), "gpu"))
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60)
    with ProxyServer(Proxy(engine, MemoryStore(), version=1)) as server:
        rid, aid = new_attempt(server)
        noisy = {k: v + 1.0 for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
        async with openai.AsyncOpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=5) as llm:
            original = await llm.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
            await server.proxy.update_weights(noisy, 2)
            updated = await llm.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
            assert updated.choices[0].message.content != original.choices[0].message.content
            _stop_unasked(server)
            await asyncio.to_thread(_wait, lambda: server.restarts == 1 and _answers(server.local_url))
            again = await llm.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
        assert again.choices[0].message.content == updated.choices[0].message.content
        assert [s.attributes[semconv.RESOURCES_VERSION] for s in spans_of(server, rid)] == [1, 2, 2]
    assert (tmp_path / "vllm.log").read_text().count("fake vllm serving") == 1  # one vLLM server all along


def test_past_its_budget_a_server_stays_down_and_says_why() -> None:
    class Fragile(StoreServer):
        restart_policy = RestartPolicy(backoff_s=0.0, budget=1)

    with Fragile(MemoryStore(), port=0) as server:
        _stop_unasked(server)
        _wait(lambda: server.restarts == 1 and _answers(server.local_url))
        _stop_unasked(server)
        _wait(lambda: server.failure is not None)
        assert "after 1 restarts within 600 s: not again" in str(server.failure)
        assert not _answers(server.local_url) and server.restarts == 1


def test_stop_is_not_a_death() -> None:
    server = StoreServer(MemoryStore(), port=0).start()
    server.stop()
    assert server.restarts == 0 and server.failure is None and not _answers(server.local_url)
