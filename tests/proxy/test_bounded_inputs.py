"""Bad input at the proxy's edge, and a client that hangs up: the real tiny model behind a real proxy.

Each case was a 500 (or engine time spent for nobody) before; now a 400 in OpenAI's format, with the
proxy still serving after.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from alight.proxy import ProxyServer

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def chat(server: ProxyServer, **fields: Any) -> httpx.Response:
    body = {"model": server.proxy.model_names[0], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body | fields, timeout=60)


def assert_400(answer: httpx.Response) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]


@pytest.mark.parametrize(
    "choice",
    [{"function": 5}, {"function": "add"}, {"type": "function", "function": {"name": ["add"]}}, {"function": {}}],
)
def test_a_malformed_tool_choice_is_400(served: ProxyServer, choice: dict[str, Any]) -> None:
    assert_400(chat(served, tools=TOOLS, tool_choice=choice))
    assert chat(served, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}).status_code == 200


def test_a_malformed_responses_tool_choice_is_400(served: ProxyServer) -> None:
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
    body = {"model": served.proxy.model_names[0], "input": "hi", "tools": tools, "max_output_tokens": 2}
    answer = httpx.post(f"{served.url}/v1/responses", json=body | {"tool_choice": {"type": "function", "name": [1]}})
    assert_400(answer)


def test_non_finite_and_out_of_range_numbers_are_400(served: ProxyServer) -> None:
    model = served.proxy.model_names[0]
    for bad in ("NaN", "Infinity"):
        raw = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}], "temperature": {bad}}}'
        answer = httpx.post(
            f"{served.url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert_400(answer)
    assert_400(chat(served, seed=2**70))
    assert httpx.get(f"{served.url}/health").json()["status"] == "ok"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_stops_its_generation(
    served: ProxyServer, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Greedy decoding from the tiny model runs to the end of its 1024-token context (~1,000 tokens).
    # The client hangs up as soon as the call is in flight; the engine must stop that row within a
    # few polls of the disconnect, far short of the context (the rows that end are recorded).
    from alight.engines import sampling

    generated: list[int] = []
    real_step = sampling.Decoder.step

    def recording(self: Any) -> Any:
        ended = real_step(self)
        generated.extend(len(output.token_ids) for _, output in ended)
        return ended

    monkeypatch.setattr(sampling.Decoder, "step", recording)
    body = json.dumps(
        {
            "model": served.proxy.model_names[0],
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100_000,
            "temperature": 0,
            "stream": stream,
        }
    ).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 10
        while httpx.get(f"{served.url}/health").json()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if stream:
            raw.settimeout(10)
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")  # the stream has begun
    deadline = time.monotonic() + 30
    while not generated and time.monotonic() < deadline:
        time.sleep(0.05)
    assert generated, "the engine never ended the hung-up call's row"
    assert generated[0] < 900, f"the hung-up call generated {generated[0]} tokens"
    assert chat(served, max_tokens=1).status_code == 200
    assert httpx.get(f"{served.url}/health").json()["in_flight"] == 0
