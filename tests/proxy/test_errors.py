"""Bad input gets an OpenAI-style error body with a 4xx, and the engine keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from alight import semconv
from alight.engines.base import ChatRequest, Generation, StreamEvent, TextDelta
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of
from tests.proxy.scripted import ScriptedEngine

OK = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _with(**changes: Any) -> dict[str, Any]:
    body = {**OK, **changes}
    return {key: value for key, value in body.items() if value is not None}


BAD: list[tuple[str, Any, int, str | None, str | None]] = [
    # (case, body, status, param, code)
    ("invalid JSON", b'{"model": "tiny", "messages": [', 400, None, "invalid_json"),
    ("not an object", b"[1, 2]", 400, None, "invalid_json"),
    ("unknown model", _with(model="gpt-9"), 404, "model", "model_not_found"),
    ("missing messages", {"model": "tiny"}, 400, "messages", "missing_required_parameter"),
    ("empty messages", _with(messages=[]), 400, "messages", "invalid_value"),
    ("messages of the wrong type", _with(messages="hi"), 400, "messages", "invalid_value"),
    ("unknown role", _with(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role", "invalid_value"),
    ("temperature of the wrong type", _with(temperature="hot"), 400, "temperature", "invalid_value"),
    ("max_tokens below 1", _with(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("tool without a function", _with(tools=[{"type": "function"}]), 400, "tools[0].function", None),
    (
        "tool schema not an object",
        _with(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
        400,
        "tools[0].function.parameters",
        "invalid_value",
    ),
    (
        "tool name with spaces",
        _with(tools=[{"type": "function", "function": {"name": "my tool"}}]),
        400,
        "tools[0].function.name",
        "invalid_value",
    ),
    ("n above 1", _with(n=2), 400, "n", "unsupported_value"),
    ("context over the limit", _with(messages=[{"role": "user", "content": "x" * 1100}]), 400, None, None),
]


@pytest.mark.parametrize(("case", "body", "status", "param", "code"), BAD, ids=[case[0] for case in BAD])
def test_bad_chat_requests(
    served: ProxyServer, case: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    raw = body if isinstance(body, bytes) else None
    response = httpx.post(
        served.base_url() + "/chat/completions",
        content=raw,
        json=None if raw is not None else body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"] and "\n" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    if case == "context over the limit":
        assert error["code"] == "context_length_exceeded" and "1024" in error["message"]
    # the engine keeps serving
    assert httpx.post(served.base_url() + "/chat/completions", json=OK).status_code == 200


def test_the_openai_client_raises_its_own_errors(served: ProxyServer) -> None:
    llm = openai.OpenAI(base_url=served.base_url(), api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="gpt-9"):
        llm.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as err:
        llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 1100}], stream=True)
    assert err.value.code == "context_length_exceeded"


def test_unknown_routes_and_bad_completions(served: ProxyServer) -> None:
    missing = httpx.post(served.url + "/v1/embeddings", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    bad = httpx.post(served.base_url() + "/completions", json={"model": "tiny", "prompt": {"a": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    two = httpx.post(served.base_url() + "/completions", json={"model": "tiny", "prompt": ["a", "b"]})
    assert two.status_code == 400 and two.json()["error"]["code"] == "unsupported_value"
    out_of_vocab = httpx.post(served.base_url() + "/completions", json={"model": "tiny", "prompt": [10**6]})
    assert out_of_vocab.status_code == 400
    assert httpx.get(served.base_url() + "/models/gpt-9").status_code == 404


class _Failing(ScriptedEngine):
    """Fails every call: before answering, or (streamed) after a first piece of text."""

    async def chat(self, request: ChatRequest) -> Generation:
        raise RuntimeError("the GPU caught fire")

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("Hel")
        raise RuntimeError("the GPU caught fire")


def test_engine_failures_are_server_errors_and_error_spans() -> None:
    with ProxyServer(Proxy(_Failing(), MemoryStore())) as server:
        rid, aid = new_attempt(server)
        llm = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.InternalServerError, match="caught fire"):
            llm.chat.completions.create(model="scripted", messages=messages)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="caught fire"):
            list(llm.chat.completions.create(model="scripted", messages=messages, stream=True))  # type: ignore[arg-type]
        spans = spans_of(server, rid)
        assert [(s.status, s.attributes[semconv.LLM_STREAM]) for s in spans] == [("error", False), ("error", True)]
        assert all("caught fire" in (s.status_message or "") for s in spans)
        assert server.proxy.gate.in_flight == 0


class _Buggy(Proxy):
    """A proxy with a bug: the model check itself fails."""

    def check_model(self, name: str) -> None:
        raise RuntimeError("a bug\nover two lines")


def test_the_app_answers_http_errors_big_bodies_and_bugs_in_openais_format() -> None:
    with ProxyServer(_Buggy(ScriptedEngine(), MemoryStore()), max_body_bytes=1000) as server:
        chat = server.base_url() + "/chat/completions"
        answers = {
            "method": (httpx.get(chat), 405, "invalid_request_error", None),
            "too big": (httpx.post(chat, content=b"x" * 2000), 413, "invalid_request_error", "payload_too_large"),
            "bug": (httpx.post(chat, json={**OK, "model": "scripted"}), 500, "server_error", None),
        }
        for case, (answer, status, kind, code) in answers.items():
            assert answer.status_code == status, (case, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, case
            assert (error["type"], error["code"]) == (kind, code), case
            assert "\n" not in error["message"] and "Traceback" not in error["message"], case
        assert "RuntimeError: a bug over two lines" in answers["bug"][0].json()["error"]["message"]
        assert httpx.get(server.url + "/health").status_code == 200
