"""The `anthropic` SDK inside an attempt, against a real proxy (ScriptedEngine behind it, so the model
calls tools) and a real store server: calls to the attempt's proxy route carry the attempt's
headers (one sequence number per call; a caller's own number is kept) and the proxy records them;
calls to any other Messages endpoint (here the proxy's bare route, which records nothing) are
recorded by the client in the same chat shape; a tool result answering the model's tool_use is a
TOOL span."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.tracing import Tracer, agent_scope
from alight.types import SpanKind
from tests.proxy.scripted import TEXT, ScriptedEngine
from tests.tracing.conftest import new_claim

anthropic = pytest.importorskip("anthropic")

ADD = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


def tool_loop(client: Any, **extra: Any) -> str:
    """The usual agent loop: call, run the tools the model asks for, call again until it answers."""
    messages: list[Any] = list(QUESTION)
    for _ in range(3):
        answer = client.messages.create(model="scripted", max_tokens=64, messages=messages, tools=[ADD], **extra)
        if answer.stop_reason != "tool_use":
            return str(answer.content[0].text)
        messages.append({"role": "assistant", "content": answer.content})
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": str(sum(block.input.values()))}
            for block in answer.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the model never answered")


@pytest.mark.anyio
async def test_proxied_and_client_recorded_calls_and_tool_spans(tracer: Tracer, tmp_path: Path) -> None:
    engine = ScriptedEngine(tool_arguments={"add": {"a": 2, "b": 3}})
    with StoreServer(MemoryStore()) as store_server, ProxyServer(Proxy(engine, StoreClient(store_server.url))) as proxy:
        async with StoreClient(store_server.url) as store:
            claim = await new_claim(store)  # type: ignore[arg-type]
            async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="solver") as ctx:
                route = f"{proxy.url}/rollout/{ctx.rollout_id}/attempt/{ctx.attempt_id}"
                proxied = anthropic.Anthropic(base_url=route, api_key="x", max_retries=0)
                assert tool_loop(proxied) == TEXT
                numbered = {semconv.HEADER_SEQUENCE_ID: "99"}
                proxied.messages.create(model="scripted", max_tokens=8, messages=QUESTION, extra_headers=numbered)
                with agent_scope("writer"):
                    other = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
                    with other.messages.stream(
                        model="scripted", max_tokens=64, system="Be brief.", messages=QUESTION, tools=[ADD]
                    ) as stream:
                        streamed = stream.get_final_message()
                    plain = other.messages.create(model="scripted", max_tokens=64, messages=QUESTION)
            proxy.flush()
            spans = sorted(await store.query_spans(claim.rollout.rollout_id), key=lambda s: s.sequence_id or 0)

    kinds = [(s.kind, s.attributes.get(semconv.AGENT_NAME), s.attributes.get(semconv.LLM_SOURCE)) for s in spans]
    assert [k for k in kinds if k[0] in (SpanKind.LLM, SpanKind.TOOL)] == [
        (SpanKind.LLM, "solver", "proxy"),
        (SpanKind.TOOL, "solver", None),
        (SpanKind.LLM, "solver", "proxy"),
        (SpanKind.LLM, "writer", "client"),
        (SpanKind.LLM, "writer", "client"),
        (SpanKind.LLM, "solver", "proxy"),  # the call that brought its own sequence number, 99
    ]
    llm = [s for s in spans if s.kind == SpanKind.LLM]
    assert llm[-1].sequence_id == 99 and len({s.sequence_id for s in spans}) == len(spans)
    tool = next(s for s in spans if s.kind == SpanKind.TOOL)
    assert (tool.name, tool.attributes[semconv.TOOL_ARGUMENTS], tool.attributes[semconv.TOOL_OUTPUT]) == (
        "add",
        {"a": 2, "b": 3},
        "5",
    )
    [asked] = llm[0].attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"]
    assert tool.attributes[semconv.TOOL_CALL_ID] == asked["id"]
    assert all(s.parent_id is not None for s in llm)  # under the agent spans, through the headers or the client

    # The client records Anthropic calls in the chat shape the proxy records.
    stream_span, plain_span = llm[2].attributes, llm[3].attributes
    [use] = streamed.content
    assert stream_span[semconv.LLM_API] == "anthropic" and stream_span[semconv.LLM_STREAM] is True
    assert stream_span[semconv.LLM_REQUEST_MESSAGES] == [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert stream_span[semconv.LLM_REQUEST_TOOLS] == [
        {"type": "function", "function": {"name": "add", "description": None, "parameters": ADD["input_schema"]}}
    ]
    call = {"id": use.id, "type": "function", "function": {"name": "add", "arguments": json.dumps(use.input)}}
    assert stream_span[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert stream_span[semconv.LLM_FINISH_REASON] == "tool_calls"
    assert plain_span[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": TEXT}
    assert plain_span[semconv.LLM_FINISH_REASON] == "stop" and plain_span[semconv.LLM_RESPONSE_MODEL] == "scripted"
    assert plain_span[semconv.LLM_USAGE]["completion_tokens"] == plain.usage.output_tokens > 0
    assert plain_span[semconv.LLM_TOKEN_IDS_SOURCE] == "none" and plain_span[semconv.LLM_REQUEST_SAMPLING] == {
        "max_tokens": 64
    }
