"""`Proxy.offloaded`: a colocated update runs with calls held and the engine asleep, then wakes it.

The engine is the real vLLM engine against the scripted vLLM-style server (a stand-in: vLLM needs a
GPU), which records its sleep-mode calls and answers 503 to any completion while asleep, so a call
that slipped past the proxy's gate during the update would fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from alight.engines.vllm_engine import VLLMEngine
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.fixtures.openai_server import Reply, ScriptedOpenAIServer
from tests.proxy.conftest import new_attempt

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me something."}]
SLEEP, WAKE = "POST /sleep?level=1&mode=wait", "POST /wake_up"


@pytest.fixture
def vllm() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(Reply(content="hello"), model=None) as server:
        yield server


@pytest.fixture
def server(vllm: ScriptedOpenAIServer) -> Iterator[ProxyServer]:
    engine = VLLMEngine(base_url=vllm.url, served_name="policy")
    with ProxyServer(Proxy(engine, MemoryStore())) as proxy_server:
        yield proxy_server


def _call_in_thread(server: ProxyServer, answers: list[Any]) -> threading.Thread:
    """One chat call from another thread (as a runner would make it); its answer lands in `answers`."""
    rid, aid = new_attempt(server)

    def call() -> None:
        client = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0, timeout=30)
        answers.append(client.chat.completions.create(model="policy", messages=MESSAGES))  # type: ignore[arg-type]

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


async def test_calls_made_during_the_update_wait_and_are_answered_after_wake_up(
    server: ProxyServer, vllm: ScriptedOpenAIServer
) -> None:
    seen: dict[str, Any] = {}
    answers: list[Any] = []
    threads: list[threading.Thread] = []

    def update() -> str:
        seen["calls at work"] = list(vllm.sleep_calls)
        threads.append(_call_in_thread(server, answers))
        time.sleep(0.5)  # long enough for the call to reach the proxy and wait there
        seen["answered during work"] = list(answers)
        seen["held"] = server.proxy.gate.paused
        return "updated"

    assert await server.proxy.offloaded(update) == "updated"
    threads[0].join(timeout=30)
    assert seen == {"calls at work": [SLEEP], "answered during work": [], "held": True}
    assert vllm.sleep_calls == [SLEEP, WAKE]  # sleep -> work -> wake_up
    [answer] = answers
    assert answer.choices[0].message.content == "hello"
    assert len(vllm.requests) == 1 and not vllm.sleeping  # it reached the engine once, after wake-up


async def test_the_work_s_exception_propagates_and_the_engine_still_wakes(
    server: ProxyServer, vllm: ScriptedOpenAIServer
) -> None:
    def update() -> None:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        await server.proxy.offloaded(update)
    assert vllm.sleep_calls == [SLEEP, WAKE] and not vllm.sleeping
    answers: list[Any] = []
    _call_in_thread(server, answers).join(timeout=30)  # the gate is open again
    assert answers[0].choices[0].message.content == "hello"


class SlowVLLM(ScriptedOpenAIServer):
    """Holds each chat call until `release` is set, then answers it (503 if asleep by then)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.arrived, self.release = threading.Event(), threading.Event()

    async def _chat(self, request: Any) -> Any:
        import anyio

        self.arrived.set()
        await anyio.to_thread.run_sync(self.release.wait)
        return await super()._chat(request)


async def test_calls_in_flight_finish_before_the_engine_sleeps() -> None:
    with SlowVLLM(Reply(content="slow"), model=None) as vllm:
        engine = VLLMEngine(base_url=vllm.url, served_name="policy")
        with ProxyServer(Proxy(engine, MemoryStore())) as server:
            answers: list[Any] = []
            call = _call_in_thread(server, answers)
            assert vllm.arrived.wait(timeout=30)  # the call is in flight, inside the engine
            order: list[str] = []
            threading.Timer(0.3, vllm.release.set).start()
            await server.proxy.offloaded(lambda: order.append(f"work after {vllm.sleep_calls}"))
            call.join(timeout=30)
    assert answers[0].choices[0].message.content == "slow"  # answered awake, not 503
    assert order == [f"work after {[SLEEP]}"] and vllm.sleep_calls == [SLEEP, WAKE]
