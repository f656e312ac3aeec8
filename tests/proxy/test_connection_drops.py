"""The network between an agent and the proxy drops its connections while a call is in flight:
the call is cancelled on the proxy (nothing recorded for it), the agent's client sends it again
and gets its answer, and the attempt holds one LLM span for the one answer the agent saw (a
dropped call never becomes a transition the agent did not use).

The drop is real: agents reach the proxy through a TCP relay (benchmarks/faults.py, the fault
soak's) that aborts every connection it carries; behind the proxy, the stand-in vLLM server
(tests/engines/fake_vllm.py) takes 2 s per answer, so the call is in flight when it drops."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from benchmarks.faults import Relay

from alight.engines import vllm_engine
from alight.engines.vllm_engine import VLLMEngine
from alight.engines.vllm_server import VLLMLauncher
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

MESSAGES = [{"role": "user", "content": "2+3?"}]


def test_a_call_whose_connection_drops_is_sent_again_and_recorded_once(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Path(__file__).parents[1] / "engines" / "fake_vllm.py"
    monkeypatch.setattr(vllm_engine, "find_vllm", lambda *a, **k: VLLMLauncher((sys.executable, str(script)), "gpu"))
    monkeypatch.setenv("FAKE_VLLM_DELAY_S", "2.0")
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60)
    log = tmp_path / "vllm.log"
    with ProxyServer(Proxy(engine, MemoryStore(), version=1)) as server:
        relay = Relay(server.port).start()
        try:
            rid, aid = new_attempt(server)
            llm = openai.OpenAI(base_url=f"{relay.url}/rollout/{rid}/attempt/{aid}/v1", api_key="x", max_retries=2)
            answers: list[object] = []
            call = threading.Thread(
                target=lambda: answers.append(llm.chat.completions.create(model="tiny", messages=MESSAGES))  # type: ignore[arg-type]
            )
            call.start()
            deadline = time.monotonic() + 30
            while log.read_text().count("fake vllm weights: begin") < 1:  # the call reached the engine
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert relay.drop() == 1
            call.join(60)
            llm.close()
            assert len(answers) == 1  # answered after the client sent it again
            assert log.read_text().count("fake vllm weights: begin") == 2  # the engine ran it twice
            spans = spans_of(server, rid)
            assert len(spans) == 1 and spans[0].attributes  # one span: the answer the agent got
        finally:
            relay.stop()
