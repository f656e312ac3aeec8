"""OpenTelemetry GenAI semantic conventions through the store: a stock OTel SDK agent (the SDK's own
OTLP/HTTP exporter, examples/otel_genai/agent.py) exports GenAI-convention spans to a real store
server with a token; `alight trace` shows them; `alight trace --otlp` writes them back in the same
conventions, and export -> ingest into a fresh store -> export keeps every attribute and the resource.
Also: alight's own spans exported as GenAI spans, the older conventions, and what the adapter does."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from alight import semconv
from alight.adapters.adapter import SpanAdapter
from alight.adapters.stats import AdapterStats
from alight.store import MemoryStore
from alight.store.otlp import spans_from_json
from alight.store.otlp_export import spans_to_otlp_json
from alight.store.server import StoreServer
from alight.types import Rollout, Span, SpanKind, SpanStatus, Task

REPO = Path(__file__).resolve().parents[2]
TOKEN = "otel-test-token"


def _example_agent() -> Any:
    spec = importlib.util.spec_from_file_location("otel_genai_agent", REPO / "examples" / "otel_genai" / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _claimed(store: MemoryStore, rollout_id: str | None = None, attempt_id: str | None = None) -> tuple[str, str]:
    rollout = (
        Rollout(task=Task(input={"q": "weather"}))
        if rollout_id is None
        else Rollout(rollout_id=rollout_id, task=Task(input={"q": "weather"}))
    )
    await store.enqueue([rollout])
    claim = await store.dequeue("w", attempt_id=attempt_id)
    assert claim is not None
    await store.start_attempt(claim.attempt.attempt_id)
    return claim.rollout.rollout_id, claim.attempt.attempt_id


def alight(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NO_COLOR": "1", "COLUMNS": "250", "ALIGHT_TOKEN": TOKEN}
    done = subprocess.run([sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def sdk_run() -> Iterator[tuple[StoreServer, str]]:
    """A store server (with a token) holding one rollout whose spans the stock SDK agent sent over OTLP."""
    store = MemoryStore()
    rollout_id, attempt_id = asyncio.run(_claimed(store))
    with StoreServer(store, watchdog_interval_s=None, token=TOKEN) as server:
        resource = Resource.create(
            {"service.name": "weather-agent", "deployment.environment": "test"}
            | {semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id}
        )
        provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"})
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        assert _example_agent().run_agent(provider.get_tracer("weather-agent")) == "It is rainy, 57°F in Paris."
        provider.shutdown()
        yield server, rollout_id


def _spans(server: StoreServer, rollout_id: str) -> list[Span]:
    answer = httpx.get(
        f"{server.url}/store/rollouts/{rollout_id}/spans", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return [Span.model_validate(s) for s in answer.json()]


def _by_name(spans: list[Span]) -> dict[str, Span]:
    return {s.name: s for s in spans}


def test_sdk_genai_spans_are_mapped_on_ingest(sdk_run: tuple[StoreServer, str]) -> None:
    server, rollout_id = sdk_run
    listed = _spans(server, rollout_id)
    spans = _by_name(listed)
    agent, weather, forecast = (
        spans["invoke_agent weather-agent"],
        spans["execute_tool get_weather"],
        spans["execute_tool get_forecast"],
    )
    first, second = sorted((s for s in listed if s.kind is SpanKind.LLM), key=lambda s: s.sequence_id or 0)
    assert [s.kind for s in (agent, weather, forecast)] == [SpanKind.AGENT, SpanKind.TOOL, SpanKind.TOOL]
    assert agent.attributes[semconv.AGENT_NAME] == "weather-agent"
    assert all(s.parent_id == agent.span_id for s in (first, second, weather, forecast))
    # LLM: model, usage, messages in OpenAI's shape (system instructions first), the answer, sampling
    a = first.attributes
    assert (a[semconv.LLM_REQUEST_MODEL], a[semconv.LLM_RESPONSE_MODEL]) == ("gpt-4o-mini", "gpt-4o-mini-2024-07-18")
    assert a[semconv.LLM_USAGE] == {"prompt_tokens": 42, "completion_tokens": 9, "total_tokens": 51}
    assert a[semconv.LLM_REQUEST_MESSAGES] == [
        {"role": "system", "content": "You report the weather."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'},  # compact JSON
    }
    assert a[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert (a[semconv.LLM_FINISH_REASON], a[semconv.LLM_REQUEST_SAMPLING]) == ("tool_calls", {"temperature": 0.7})
    b = second.attributes
    assert b[semconv.LLM_REQUEST_MESSAGES][2:] == [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 57°F"},
    ]
    assert b[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": "It is rainy, 57°F in Paris."}
    # tools: name, call id, arguments (an object), result; the failed one is an error with its exception event
    assert {k: weather.attributes[k] for k in (semconv.TOOL_NAME, semconv.TOOL_CALL_ID, semconv.TOOL_ARGUMENTS)} == {
        semconv.TOOL_NAME: "get_weather",
        semconv.TOOL_CALL_ID: "call_1",
        semconv.TOOL_ARGUMENTS: {"location": "Paris"},
    }
    assert weather.attributes[semconv.TOOL_OUTPUT] == "rainy, 57°F" and weather.status is SpanStatus.UNSET
    assert forecast.status is SpanStatus.ERROR and forecast.attributes[semconv.TOOL_ERROR] is True
    assert forecast.status_message == "TimeoutError: forecast service did not answer in 5 s"  # the SDK sets it
    [event] = forecast.attributes[semconv.OTEL_EVENTS]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "TimeoutError"
    # the originals are kept as sent, and the sender's resource on every span (without the routing ids)
    assert json.loads(a["gen_ai.input.messages"])[0]["parts"][0]["content"] == "What's the weather in Paris?"
    for span in spans.values():
        assert span.attributes["resource.service.name"] == "weather-agent"
        assert span.attributes["resource.deployment.environment"] == "test"
        assert not any(k.startswith("resource.alight.") for k in span.attributes)


def test_alight_trace_shows_and_exports_them_and_a_round_trip_keeps_them(
    sdk_run: tuple[StoreServer, str], tmp_path: Path
) -> None:
    server, rollout_id = sdk_run
    tree = alight("trace", server.url, "--rollout", rollout_id).stdout
    for shown in (
        "[weather-agent]",
        "service weather-agent",
        "model gpt-4o-mini-2024-07-18  42->9 tokens  finish tool_calls",
        "61->11 tokens",
        "calls get_weather",
        'get_weather({"location": "Paris"}) -> rainy, 57°F',
        'get_forecast({"location": "Paris", "days": 3}) -> -  (tool error)',
        "error: TimeoutError: forecast service did not answer in 5 s",
    ):
        assert shown in tree, (shown, tree)
    assert "?->?" not in tree and "null" not in tree

    first = tmp_path / "first.json"
    as_json = json.loads(alight("trace", server.url, "--rollout", rollout_id, "--json", "--otlp", str(first)).stdout)
    llm = next(s for s in as_json["spans"] if s["kind"] == "llm")
    assert llm["attributes"][semconv.LLM_USAGE]["prompt_tokens"] == 42
    assert llm["attributes"]["resource.service.name"] == "weather-agent"
    exported = json.loads(first.read_text())
    [resource_spans] = exported["resourceSpans"]  # one sender, one resource
    resource = {kv["key"]: kv["value"] for kv in resource_spans["resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "weather-agent"}
    assert resource["deployment.environment"] == {"stringValue": "test"}
    attrs = _exported_attributes(exported)
    for span_attrs in attrs.values():
        assert not any(k.startswith("resource.") for k in span_attrs)
    by_op: dict[str, list[dict[str, Any]]] = {}
    for span_attrs in attrs.values():
        by_op.setdefault(span_attrs["gen_ai.operation.name"]["stringValue"], []).append(span_attrs)
    assert sorted((op, len(v)) for op, v in by_op.items()) == [("chat", 2), ("execute_tool", 2), ("invoke_agent", 1)]
    assert by_op["invoke_agent"][0]["gen_ai.agent.name"] == {"stringValue": "weather-agent"}
    assert {c["gen_ai.usage.input_tokens"]["intValue"] for c in by_op["chat"]} == {"42", "61"}

    # export -> ingest into a fresh store (the same rollout and attempt ids) -> export: nothing lost or added
    old = _spans(server, rollout_id)[0]
    fresh = MemoryStore()
    asyncio.run(_claimed(fresh, old.rollout_id, old.attempt_id))
    with StoreServer(fresh, watchdog_interval_s=None) as second_server:
        answer = httpx.post(f"{second_server.url}/v1/traces", json=exported, timeout=10)
        assert answer.status_code == 200 and answer.json() == {}, answer.text
        again = spans_to_otlp_json(_spans(second_server, rollout_id))
    assert _exported_attributes(again) == attrs
    assert again["resourceSpans"][0]["resource"] == resource_spans["resource"]
    events = {s["name"]: s.get("events") for s in resource_spans["scopeSpans"][0]["spans"]}
    assert events["execute_tool get_forecast"][0]["name"] == "exception"
    assert {s["name"]: s.get("events") for s in again["resourceSpans"][0]["scopeSpans"][0]["spans"]} == events


def _exported_attributes(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        span["spanId"]: {kv["key"]: kv["value"] for kv in span["attributes"]}
        for rs in request["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    }


def test_the_adapter_on_genai_spans(sdk_run: tuple[StoreServer, str]) -> None:
    """Without token ids the calls are skipped (counted), with a tokenizer rebuilt from the mapped
    messages (unless the proxy recorded the attempt's calls), with token ids selected by the agent
    span's gen_ai.agent.name."""
    server, rollout_id = sdk_run
    spans = _spans(server, rollout_id)
    stats = AdapterStats()
    adapted = SpanAdapter(agent_match="weather-agent").adapt(spans, rollout_id=rollout_id, stats=stats)
    assert adapted.transitions == [] and (stats.llm_calls, stats.calls_skipped_no_ids) == (2, 2)

    seen: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    def tokenize(messages: list[dict[str, Any]], tools: Any, reply: dict[str, Any]) -> tuple[list[int], list[int]]:
        seen.append((messages, reply))
        return list(range(len(messages))), [7]

    adapted = SpanAdapter(agent_match="weather-agent", tokenizer=tokenize).adapt(spans, rollout_id=rollout_id)
    assert [(t.agent_name, list(t.prompt_ids)) for t in adapted.transitions] == [
        ("weather-agent", [0, 1]),
        ("weather-agent", [0, 1, 2, 3]),
    ]
    assert seen[1][0][3] == {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 57°F"}
    assert SpanAdapter(agent_match="other", tokenizer=tokenize).adapt(spans, rollout_id=rollout_id).transitions == []

    # The agent's calls went through the proxy too: its spans (token ids) are the calls, the OTel reports are not.
    proxy = Span(
        rollout_id=rollout_id,
        attempt_id=spans[0].attempt_id,
        sequence_id=0,
        name="llm.chat",
        kind=SpanKind.LLM,
        attributes={
            semconv.LLM_SOURCE: "proxy",
            semconv.AGENT_NAME: "weather-agent",
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2],
            semconv.LLM_RESPONSE_TOKEN_IDS: [3],
            semconv.LLM_RESPONSE_LOGPROBS: [-0.5],
        },
    )
    stats = AdapterStats()
    adapted = SpanAdapter(agent_match="weather-agent", tokenizer=tokenize).adapt(
        [proxy, *spans], rollout_id=rollout_id, stats=stats
    )
    assert [list(t.response_ids) for t in adapted.transitions] == [[3]] and stats.calls_skipped_no_ids == 2

    with_ids = [
        s.model_copy(
            update={
                "attributes": {
                    **s.attributes,
                    semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3],
                    semconv.LLM_RESPONSE_TOKEN_IDS: [4, 5],
                    semconv.LLM_RESPONSE_LOGPROBS: [-0.1, -0.2],
                }
            }
        )
        if s.kind is SpanKind.LLM
        else s
        for s in spans
    ]
    adapted = SpanAdapter(agent_match="weather-agent").adapt(with_ids, rollout_id=rollout_id)
    assert [(t.agent_name, list(t.response_ids)) for t in adapted.transitions] == [("weather-agent", [4, 5])] * 2


def _native_spans() -> list[Span]:
    ids = {"rollout_id": "ro-1", "attempt_id": "at-1"}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "add", "description": "a+b", "parameters": {"type": "object"}}}]
    return [
        Span(**ids, sequence_id=1, span_id="a" * 16, name="solver", kind=SpanKind.AGENT,
             attributes={semconv.AGENT_NAME: "solver"}),
        Span(**ids, sequence_id=2, parent_id="a" * 16, name="llm.chat", kind=SpanKind.LLM, attributes={
            semconv.LLM_SOURCE: "proxy", semconv.LLM_API: "chat", semconv.LLM_REQUEST_MODEL: "tiny",
            semconv.LLM_REQUEST_MESSAGES: messages, semconv.LLM_REQUEST_TOOLS: tools,
            semconv.LLM_REQUEST_SAMPLING: {"temperature": 1.0, "max_tokens": 64, "stop": "\n"},
            semconv.LLM_RESPONSE_MESSAGE: {"role": "assistant", "content": "5"}, semconv.LLM_FINISH_REASON: "stop",
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3, 4], semconv.LLM_RESPONSE_TOKEN_IDS: [5, 6],
            semconv.LLM_RESPONSE_LOGPROBS: [-0.5, -0.25], semconv.LLM_TOKEN_IDS_SOURCE: "engine"}),
        Span(**ids, sequence_id=3, parent_id="a" * 16, name="add", kind=SpanKind.TOOL, status=SpanStatus.ERROR,
             status_message="boom", attributes={semconv.TOOL_NAME: "add", semconv.TOOL_CALL_ID: "c1",
             semconv.TOOL_ARGUMENTS: {"a": 2, "b": 3}, semconv.TOOL_OUTPUT: "overflow", semconv.TOOL_ERROR: True,
             semconv.EXCEPTION_TYPE: "OverflowError"}),
    ]  # fmt: skip


def test_alight_spans_export_in_the_genai_conventions_and_read_back() -> None:
    native = _native_spans()
    request = spans_to_otlp_json(native)
    assert request["resourceSpans"][0]["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "alight"}}
    ]
    agent, llm, tool = (_plain(v) for v in _exported_attributes(request).values())
    assert (agent["gen_ai.operation.name"], agent["gen_ai.agent.name"]) == ("invoke_agent", "solver")
    assert llm["gen_ai.operation.name"] == "chat" and llm["gen_ai.provider.name"] == "alight"
    assert (llm["gen_ai.usage.input_tokens"], llm["gen_ai.usage.output_tokens"]) == ("4", "2")  # the token ids
    assert (llm["gen_ai.request.model"], llm["gen_ai.response.finish_reasons"]) == ("tiny", ["stop"])
    assert (llm["gen_ai.request.temperature"], llm["gen_ai.request.max_tokens"]) == (1.0, "64")
    assert llm["gen_ai.request.stop_sequences"] == ["\n"]
    assert json.loads(llm["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "2+3?"}]},
        {"role": "assistant",
         "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "5"}]},
    ]  # fmt: skip
    assert json.loads(llm["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "5"}], "finish_reason": "stop"}
    ]
    assert json.loads(llm["gen_ai.tool.definitions"]) == [
        {"type": "function", "name": "add", "description": "a+b", "parameters": {"type": "object"}}
    ]
    assert (tool["gen_ai.operation.name"], tool["gen_ai.tool.name"], tool["gen_ai.tool.call.id"]) == (
        "execute_tool",
        "add",
        "c1",
    )
    assert (
        json.loads(tool["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
        and tool["gen_ai.tool.call.result"] == "overflow"
    )
    assert tool["error.type"] == "OverflowError"
    assert llm[semconv.LLM_PROMPT_TOKEN_IDS] == "[1, 2, 3, 4]"  # alight's own attributes travel too

    # Read back as a GenAI-only sender would send it (alight's attributes stripped): the same messages.
    genai_only = json.loads(json.dumps(request))
    for span in genai_only["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["attributes"] = [
            kv for kv in span["attributes"] if kv["key"].startswith(("gen_ai.", "error.", "alight.r", "alight.a"))
        ]
    back, dropped = spans_from_json(json.dumps(genai_only).encode())
    assert dropped == 0
    b_agent, b_llm, b_tool = back
    assert (b_agent.kind, b_llm.kind, b_tool.kind) == (SpanKind.AGENT, SpanKind.LLM, SpanKind.TOOL)
    assert b_agent.attributes[semconv.AGENT_NAME] == "solver"
    # (tool call arguments travel as an object, as GenAI wants: the same JSON, not the same spacing)
    for key in (semconv.LLM_REQUEST_MESSAGES, semconv.LLM_RESPONSE_MESSAGE, semconv.LLM_REQUEST_TOOLS):
        assert _arguments_parsed(b_llm.attributes[key]) == _arguments_parsed(native[1].attributes[key]), key
    assert b_llm.attributes[semconv.LLM_USAGE] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert b_llm.attributes[semconv.LLM_REQUEST_SAMPLING] == {"temperature": 1.0, "max_tokens": 64, "stop": ["\n"]}
    assert b_tool.status is SpanStatus.ERROR and b_tool.attributes[semconv.TOOL_ERROR] is True
    assert b_tool.attributes[semconv.TOOL_ARGUMENTS] == {"a": 2, "b": 3}


def _arguments_parsed(value: Any) -> Any:
    if isinstance(value, list):
        return [_arguments_parsed(v) for v in value]
    if isinstance(value, dict):
        return {k: json.loads(v) if k == "arguments" else _arguments_parsed(v) for k, v in value.items()}
    return value


def _plain(attributes: dict[str, Any]) -> dict[str, Any]:
    def value(v: dict[str, Any]) -> Any:
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"]["values"]]
        return next(iter(v.values()))

    return {k: value(v) for k, v in attributes.items()}


def _json_span(name: str, attributes: dict[str, Any], events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, list):
            return {"arrayValue": {"values": [value(x) for x in v]}}
        return {"stringValue": v}

    pairs = [
        {"key": k, "value": value(v)}
        for k, v in {semconv.ROLLOUT_ID: "ro-1", semconv.ATTEMPT_ID: "at-1", **attributes}.items()
    ]
    span: dict[str, Any] = {"traceId": "1" * 32, "spanId": os.urandom(8).hex(), "name": name, "attributes": pairs,
                            "startTimeUnixNano": "1700000000000000000",
                            "endTimeUnixNano": "1700000001000000000"}  # fmt: skip
    if events:
        span["events"] = [{"name": e["name"], "timeUnixNano": "1700000000500000000",
                           "attributes": [{"key": k, "value": value(v)} for k, v in e["attributes"].items()]}
                          for e in events]  # fmt: skip
    return span


def test_older_conventions_and_plain_agent_names() -> None:
    spans = [
        _json_span("openai.chat", {
            "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4",
            "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "Be brief.",
            "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "hi",
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "c9", "gen_ai.completion.0.tool_calls.0.name": "look",
            "gen_ai.completion.0.tool_calls.0.arguments": "{}",
            "gen_ai.usage.prompt_tokens": 12, "gen_ai.usage.completion_tokens": 3}),
        _json_span("chat", {"gen_ai.operation.name": "chat", "gen_ai.agent.name": "planner"}, events=[
            {"name": "gen_ai.content.prompt",
             "attributes": {"gen_ai.prompt": json.dumps([{"role": "user", "content": "plan"}])}},
            {"name": "gen_ai.content.completion",
             "attributes": {"gen_ai.completion": json.dumps([{"role": "assistant", "content": "ok"}])}},
        ]),
        _json_span("crew step", {"agent.name": "researcher"}),
        _json_span("embeddings text-embedding-3", {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "e"}),
        _json_span("chat failed", {"gen_ai.operation.name": "chat", "error.type": "RateLimitError"}),
    ]  # fmt: skip
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}
    old, events, plain, embed, failed = spans_from_json(json.dumps(body).encode())[0]
    assert old.kind is SpanKind.LLM and old.attributes[semconv.LLM_REQUEST_MESSAGES] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert old.attributes[semconv.LLM_RESPONSE_MESSAGE] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "look", "arguments": "{}"}}],
    }
    assert old.attributes[semconv.LLM_USAGE] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert old.attributes[semconv.LLM_FINISH_REASON] == "tool_calls"
    assert events.kind is SpanKind.LLM and events.attributes[semconv.AGENT_NAME] == "planner"
    assert events.attributes[semconv.LLM_REQUEST_MESSAGES] == [{"role": "user", "content": "plan"}]
    assert events.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"] == "ok"
    assert (plain.kind, plain.attributes[semconv.AGENT_NAME]) == (SpanKind.AGENT, "researcher")
    assert embed.kind is SpanKind.OTHER  # no chat turn: not an LLM call for the adapter
    assert (failed.status, failed.status_message) == (SpanStatus.ERROR, "RateLimitError")


def test_odd_genai_values_are_stored_as_sent() -> None:
    spans = [
        _json_span("chat", {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "5",
                            "gen_ai.tool.definitions": "7",
                            "gen_ai.output.messages": "[1, {\"parts\": 3}]", "gen_ai.usage.input_tokens": True}),
        _json_span("execute_tool",
                   {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": "{not json"}),
    ]  # fmt: skip
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}
    chat, tool = spans_from_json(json.dumps(body).encode())[0]
    assert chat.kind is SpanKind.LLM and semconv.LLM_USAGE not in chat.attributes
    assert chat.attributes["gen_ai.input.messages"] == "5"
    assert (tool.kind, tool.attributes[semconv.TOOL_NAME], tool.attributes[semconv.TOOL_ARGUMENTS]) == (
        SpanKind.TOOL,
        "execute_tool",
        "{not json",
    )


def test_the_example_agent_script_runs_alone_and_with_the_standard_otel_variables() -> None:
    """examples/otel_genai/agent.py as a user runs it: claiming its own rollout, and with the
    rollout named in OTEL_RESOURCE_ATTRIBUTES and the token in OTEL_EXPORTER_OTLP_HEADERS."""
    store = MemoryStore()
    rollout_id, attempt_id = asyncio.run(_claimed(store))
    script = [sys.executable, str(REPO / "examples" / "otel_genai" / "agent.py")]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ALIGHT_"))}
    with StoreServer(store, watchdog_interval_s=None, token=TOKEN) as server:
        own = {**base, "ALIGHT_TOKEN": TOKEN}
        alone = subprocess.run([*script, "--store", server.url], env=own, capture_output=True, text=True, timeout=60)
        assert alone.returncode == 0, alone.stderr
        own_rollout = alone.stdout.split()[1]
        env = {
            **base,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{server.url}/v1/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
            "OTEL_RESOURCE_ATTRIBUTES": f"{semconv.ROLLOUT_ID}={rollout_id},{semconv.ATTEMPT_ID}={attempt_id}",
            "OTEL_SERVICE_NAME": "weather-agent-v2",
        }
        named = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
        assert named.returncode == 0, named.stderr
        mine, theirs = _spans(server, own_rollout), _spans(server, rollout_id)
        finished = asyncio.run(store.get_rollout(own_rollout))
    assert finished.status.value == "succeeded" and finished.reward == 1.0
    assert len(mine) == len(theirs) == 5
    assert {s.attributes["resource.service.name"] for s in mine} == {"weather-agent"}
    assert {s.attributes["resource.service.name"] for s in theirs} == {"weather-agent-v2"}
    assert sorted(s.kind.value for s in theirs) == ["agent", "llm", "llm", "tool", "tool"]


def test_genai_spans_of_other_instrumentation_inside_an_attempt_of_the_otel_tracer() -> None:
    """The OTel tracer with the user's TracerProvider: GenAI spans another instrumentation makes
    inside an attempt are mapped as OTLP spans are, and name their own agent (not the runner's)."""
    from alight.tracing.otel import OtelTracer

    async def run() -> list[Span]:
        store = MemoryStore()
        rollout_id, attempt_id = await _claimed(store)
        provider = TracerProvider()
        tracer = OtelTracer(provider)
        rollout, attempt = await store.get_rollout(rollout_id), await store.get_attempt(attempt_id)
        async with tracer.attempt(store, rollout, attempt, agent_name="runner-agent"):
            _example_agent().run_agent(provider.get_tracer("instrumentation"))
        return await store.query_spans(rollout_id)

    spans = asyncio.run(run())
    by_kind: dict[SpanKind, list[Span]] = {}
    for span in spans:
        by_kind.setdefault(span.kind, []).append(span)
    assert sorted(s.name for s in by_kind[SpanKind.AGENT]) == ["invoke_agent weather-agent", "runner-agent"]
    assert len(by_kind[SpanKind.LLM]) == 2 and len(by_kind[SpanKind.TOOL]) == 2
    for span in by_kind[SpanKind.LLM] + by_kind[SpanKind.TOOL]:
        assert span.attributes[semconv.AGENT_NAME] == "weather-agent", span.name
    first = min(by_kind[SpanKind.LLM], key=lambda s: s.sequence_id or 0)
    assert first.attributes[semconv.LLM_USAGE]["prompt_tokens"] == 42
    assert first.attributes[semconv.LLM_SOURCE] == semconv.LLM_SOURCE_OTEL
