"""Async training's weight switch on the vLLM path: calls in flight finish on the weights they
started with, the reload reaches vLLM between calls, and each span records the version that served it.

The engine is the real `VLLMEngine` driving a `vllm serve` process, here the stand-in command
(tests/engines/fake_vllm.py: vLLM needs a GPU) behind the real proxy, gate and store. The fake's
answer names a digest of the weights it serves; each chat takes FAKE_VLLM_DELAY_S and the fake
logs when it began and ended and when it reloaded, and answers a mixed `weights A->B` if a reload
landed while it ran (what a real vLLM would do: the later tokens by the new weights).
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from alight import semconv
from alight.engines import vllm_engine
from alight.engines.vllm_engine import VLLMEngine
from alight.engines.vllm_server import VLLMLauncher
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

DELAY_S = 1.0
MESSAGES = [{"role": "user", "content": "2+3?"}]


@pytest.fixture
def server(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxyServer]:
    script = Path(__file__).with_name("fake_vllm.py")
    monkeypatch.setattr(vllm_engine, "find_vllm", lambda *a, **k: VLLMLauncher((sys.executable, str(script)), "gpu"))
    monkeypatch.setenv("FAKE_VLLM_DELAY_S", str(DELAY_S))
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path / "vllm", startup_timeout_s=60)
    with ProxyServer(Proxy(engine, MemoryStore(), version=0)) as proxy_server:
        yield proxy_server


def call(server: ProxyServer, answers: dict[str, str]) -> threading.Thread:
    """One chat call from a runner's thread; its answer lands in `answers` under its rollout id."""
    rid, aid = new_attempt(server)

    def run() -> None:
        client = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
        answers[rid] = str(reply.choices[0].message.content)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def events(log: Path) -> list[list[str]]:
    prefix = "fake vllm weights: "
    return [line.removeprefix(prefix).split() for line in log.read_text().splitlines() if line.startswith(prefix)]


def test_calls_in_flight_finish_on_their_weights_and_later_calls_record_the_new_version(
    server: ProxyServer, tiny_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    new_dir = tmp_path / "policy-1"
    new_dir.mkdir()
    state = {k: v + 1.0 for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
    save_file(state, str(new_dir / "model.safetensors"), metadata={"format": "pt"})
    old = hashlib.sha256((tiny_dir / "model.safetensors").read_bytes()).hexdigest()[:12]
    new = hashlib.sha256((new_dir / "model.safetensors").read_bytes()).hexdigest()[:12]
    proxy = server.proxy

    answers: dict[str, str] = {}
    early = [call(server, answers) for _ in range(3)]
    wait_until(lambda: proxy.gate.in_flight == 3)  # three calls are at the engine
    updater = threading.Thread(target=lambda: server.run(proxy.update_weights(str(new_dir), 1)), daemon=True)
    updater.start()
    wait_until(lambda: proxy.gate.paused)  # the update waits for the calls in flight
    late = [call(server, answers) for _ in range(2)]  # runners go on calling: these wait at the gate
    time.sleep(0.2)
    assert proxy.gate.in_flight == 3 and proxy.version == 0 and not answers
    for thread in [*early, updater, *late]:
        thread.join(timeout=60)
    assert proxy.version == 1 and len(answers) == 5

    # the version each span records is the one whose weights answered it
    served = {0: f"weights {old}", 1: f"weights {new}"}
    versions = []
    for rid, text in answers.items():
        [span] = spans_of(server, rid)
        version = span.attributes[semconv.RESOURCES_VERSION]
        assert text == served[version], (rid, version, text)
        versions.append(version)
    assert sorted(versions) == [0, 0, 0, 1, 1]

    # at the server: the reload came between calls, after the three in flight ended, before the two
    log = events(tmp_path / "vllm" / "vllm.log")
    assert log[0] == ["reload", old]  # the start-up read
    reload_at = log.index(["reload", new])
    before, after = log[1:reload_at], log[reload_at + 1 :]
    assert sorted(map(tuple, before)) == sorted([("begin", old)] * 3 + [("end", old, old)] * 3)
    assert sorted(map(tuple, after)) == sorted([("begin", new)] * 2 + [("end", new, new)] * 2)
