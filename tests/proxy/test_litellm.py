"""The proxy in front of the `litellm` engine, pointed at a second local OpenAI-compatible server:
another alight proxy in process (tiny model, or the scripted engine for tool calls), and
`alight serve` in a subprocess (slow)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.store.server import StoreServer
from tests.fixtures.tools import ADD_TOOLS
from tests.proxy.conftest import claim_at, new_attempt, spans_at, spans_of
from tests.proxy.scripted import ScriptedEngine

pytest.importorskip("litellm")

MESSAGES = [{"role": "user", "content": "What is 2+3?"}]
TOOLS = ADD_TOOLS


def _front(upstream_v1: str, model: str) -> ProxyServer:
    from alight.engines.litellm_engine import LiteLLMEngine

    engine = LiteLLMEngine(f"openai/{model}", base_url=upstream_v1, served_name=model, timeout_s=60)
    return ProxyServer(Proxy(engine, MemoryStore()))


@pytest.fixture(scope="module")
def scripted_upstream() -> Iterator[ProxyServer]:
    with ProxyServer(Proxy(ScriptedEngine(tool_arguments={"add": {"a": 2, "b": 3}}))) as server:
        yield server


def test_token_ids_pass_through_two_proxies(served: ProxyServer) -> None:
    with _front(served.base_url(), "tiny") as front:
        rid, aid = new_attempt(front)
        inner_rid, inner_aid = new_attempt(served)
        llm = openai.OpenAI(base_url=front.base_url(rid, aid), api_key="x", max_retries=0)
        answer = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        [span] = spans_of(front, rid)
        a = span.attributes
        assert a[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"
        # the same greedy call made straight to the inner proxy records the same ids and log-probs
        direct = openai.OpenAI(base_url=served.base_url(inner_rid, inner_aid), api_key="x", max_retries=0)
        direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        [inner] = spans_of(served, inner_rid)
        for key in (semconv.LLM_PROMPT_TOKEN_IDS, semconv.LLM_RESPONSE_TOKEN_IDS, semconv.LLM_RESPONSE_LOGPROBS):
            assert a[key] == inner.attributes[key]
        assert answer.choices[0].message.content == inner.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"]


def test_tool_calls_through_litellm(scripted_upstream: ProxyServer) -> None:
    with _front(scripted_upstream.base_url(), "scripted") as front:
        rid, aid = new_attempt(front)
        llm = openai.OpenAI(base_url=front.base_url(rid, aid), api_key="x", max_retries=0)
        answer = llm.chat.completions.create(model="scripted", messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
        [call] = answer.choices[0].message.tool_calls or []
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
        chunks = list(llm.chat.completions.create(model="scripted", messages=MESSAGES, tools=TOOLS, stream=True))  # type: ignore[arg-type]
        streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert streamed[0].function and streamed[0].function.name == "add"
        spans = spans_of(front, rid)
        assert [s.attributes[semconv.LLM_FINISH_REASON] for s in spans] == ["tool_calls", "tool_calls"]
        assert spans[0].attributes[semconv.LLM_REQUEST_TOOLS] == TOOLS


def test_upstream_down_is_a_server_error_and_the_proxy_keeps_serving() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with _front(dead, "tiny") as front:
        answer = httpx.post(front.base_url() + "/chat/completions", json={"model": "tiny", "messages": MESSAGES})
        assert answer.status_code >= 500 and answer.json()["error"]["type"] == "server_error"
        assert httpx.get(front.base_url() + "/models").status_code == 200


@pytest.mark.slow
def test_alight_serve_subprocess_behind_the_litellm_engine(tiny_dir: Path) -> None:
    """`alight serve --store URL` in a subprocess: the upstream of a litellm engine behind an
    in-process proxy, and itself a recording proxy for calls that carry attempt ids."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store_server = StoreServer(MemoryStore()).start()
    command = ["serve", "--model", str(tiny_dir), "--served-name", "tiny", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "alight", *command, "--store", store_server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    upstream = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(upstream + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "alight serve did not come up"
            time.sleep(0.2)
        with _front(upstream + "/v1", "tiny") as front:
            rid, aid = new_attempt(front)
            llm = openai.OpenAI(base_url=front.base_url(rid, aid), api_key="x", max_retries=0)
            answer = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0)  # type: ignore[arg-type]
            assert answer.usage is not None and answer.usage.completion_tokens == 5
            [span] = spans_of(front, rid)
            assert span.attributes[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"
            assert len(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]) == 5
            assert len(span.attributes[semconv.LLM_RESPONSE_LOGPROBS]) == 5

        rid, aid = asyncio.run(claim_at(store_server.url))  # below: greedy, so no early EOS cuts the 3 tokens
        direct = openai.OpenAI(base_url=f"{upstream}/rollout/{rid}/attempt/{aid}/v1", api_key="x", max_retries=0)
        direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)  # type: ignore[arg-type]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    try:
        assert proc.returncode == 0, err
        assert f"{upstream}/v1" in err  # the URL is printed when ready
        assert "Loading weights" not in err and "it/s]" not in err  # transformers' progress bar stays off
        [recorded] = asyncio.run(spans_at(store_server.url, rid))  # flushed on Ctrl-C
        assert recorded.attributes[semconv.LLM_USAGE]["completion_tokens"] == 3
    finally:
        store_server.stop()


@pytest.mark.slow
def test_alight_serve_bad_models_are_one_line_and_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    for model, message in (("/no/such/model", "no model at /no/such/model"), (str(broken), "cannot load model")):
        result = subprocess.run(
            [sys.executable, "-m", "alight", "serve", "--model", model], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
