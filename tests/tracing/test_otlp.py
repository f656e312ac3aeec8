"""The OTLP/HTTP receiver on the store server: the real OTel exporter (protobuf) and OTLP/JSON."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from alight import semconv
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.types import Claim, SpanKind, SpanStatus
from tests.tracing.conftest import new_claim


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        yield server


async def claim_on(server: StoreServer) -> Claim:
    client = StoreClient(server.url)
    try:
        return await new_claim(client)  # type: ignore[arg-type]
    finally:
        await client.close()


async def spans_of(server: StoreServer, rollout_id: str) -> list:  # type: ignore[type-arg]
    client = StoreClient(server.url)
    try:
        return await client.query_spans(rollout_id)
    finally:
        await client.close()


@pytest.mark.anyio
async def test_the_otel_sdk_exporter_sends_spans_into_the_store(server: StoreServer) -> None:
    claim = await claim_on(server)
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    # An agent instrumented with plain OpenTelemetry: the ids ride on the resource.
    provider = TracerProvider(
        resource=Resource.create({semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id})
    )
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.url}/v1/traces")))
    tracer = provider.get_tracer("user-agent")
    messages = [{"role": "user", "content": "hi"}]
    with tracer.start_as_current_span("my-agent", attributes={semconv.SPAN_KIND: "agent", semconv.SEQUENCE_ID: 1}):
        with tracer.start_as_current_span("llm.chat") as llm:
            llm.set_attribute(semconv.LLM_REQUEST_MESSAGES, json.dumps(messages))
            llm.set_attribute(semconv.LLM_USAGE, json.dumps({"total_tokens": 3}))
            llm.set_attribute(semconv.SEQUENCE_ID, 2)
        with tracer.start_as_current_span("search") as tool:
            tool.set_attribute(semconv.TOOL_NAME, "search")
            tool.set_attribute(semconv.TOOL_OUTPUT, "not json")  # plain text stays text
            tool.set_attribute("tags", ["a", "b"])
            tool.set_status(Status(StatusCode.ERROR, "no results"))
            tool.set_attribute(semconv.SEQUENCE_ID, 3)
    provider.shutdown()
    root, llm_span, tool_span = await spans_of(server, rollout_id)
    for span in (root, llm_span, tool_span):  # the resource is kept on each span, but the ids
        resource = {k: span.attributes.pop(k) for k in list(span.attributes) if k.startswith(semconv.RESOURCE_PREFIX)}
        assert resource["resource.telemetry.sdk.name"] == "opentelemetry"
        assert "resource.alight.rollout_id" not in resource
    assert (root.name, root.kind, root.parent_id) == ("my-agent", SpanKind.AGENT, None)
    assert (llm_span.kind, llm_span.parent_id, llm_span.sequence_id) == (SpanKind.LLM, root.span_id, 2)
    assert llm_span.attributes == {semconv.LLM_REQUEST_MESSAGES: messages, semconv.LLM_USAGE: {"total_tokens": 3}}
    assert tool_span.kind is SpanKind.TOOL and tool_span.status is SpanStatus.ERROR
    assert tool_span.status_message == "no results"
    assert tool_span.attributes == {semconv.TOOL_NAME: "search", semconv.TOOL_OUTPUT: "not json", "tags": ["a", "b"]}
    assert all(span.attempt_id == attempt_id and len(span.trace_id) == 32 for span in (root, llm_span, tool_span))
    assert root.end_time is not None and root.end_time >= tool_span.end_time > root.start_time


def otlp_json(rollout_id: str | None, attempt_id: str, spans: list[dict]) -> dict:  # type: ignore[type-arg]
    resource = [{"key": "service.name", "value": {"stringValue": "agent"}}]
    if rollout_id is not None:
        resource.append({"key": semconv.ROLLOUT_ID, "value": {"stringValue": rollout_id}})
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": resource},
                "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}],
            }
        ]
    }


def json_span(span_id: str, name: str, attempt_id: str, **extra: object) -> dict:  # type: ignore[type-arg]
    return {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001500000000",
        "attributes": [
            {"key": semconv.ATTEMPT_ID, "value": {"stringValue": attempt_id}},
            {"key": semconv.REWARD_VALUE, "value": {"doubleValue": 0.5}},
            {"key": semconv.SEQUENCE_ID, "value": {"intValue": "7"}},
            {"key": "flags", "value": {"arrayValue": {"values": [{"boolValue": True}, {"intValue": "2"}]}}},
            {"key": "meta", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}},
        ],
        "status": {"code": 1},
        **extra,
    }


@pytest.mark.anyio
async def test_otlp_json_post(server: StoreServer) -> None:
    claim = await claim_on(server)
    rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
    body = otlp_json(rollout_id, attempt_id, [json_span("EEE19B7EC3C1B174", "reward", attempt_id)])
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.post(f"{server.url}/v1/traces", json=body)
        assert answer.status_code == 200 and answer.json() == {}
        # gzip, as a Collector sends it; the same span again is stored once
        packed = gzip.compress(json.dumps(body).encode())
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        assert (await http.post(f"{server.url}/v1/traces", content=packed, headers=headers)).status_code == 200
    (span,) = await spans_of(server, rollout_id)
    assert (span.span_id, span.trace_id) == ("eee19b7ec3c1b174", "5b8efff798038103d269b633813fc60c")
    assert (span.kind, span.sequence_id, span.status) == (SpanKind.REWARD, 7, SpanStatus.OK)
    assert (span.start_time, span.end_time) == (1700000000.0, 1700000001.5)
    assert span.attributes == {
        semconv.REWARD_VALUE: 0.5,
        "flags": [True, 2],
        "meta": {"k": "v"},
        "resource.service.name": "agent",  # the sender's resource, without the rollout id
    }


@pytest.mark.anyio
async def test_spans_that_belong_nowhere_are_rejected_in_a_partial_success(server: StoreServer) -> None:
    claim = await claim_on(server)
    attempt_id = claim.attempt.attempt_id
    body = otlp_json(
        claim.rollout.rollout_id,
        attempt_id,
        [json_span("0000000000000001", "ok", attempt_id), json_span("0000000000000002", "lost", "at-unknown")],
    )
    body["resourceSpans"].append(
        otlp_json(None, attempt_id, [json_span("0000000000000003", "no-ids", "")])["resourceSpans"][0]
    )
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.post(f"{server.url}/v1/traces", json=body)
    assert answer.status_code == 200
    partial = answer.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "2" and "at-unknown" in partial["errorMessage"]
    assert [span.name for span in await spans_of(server, claim.rollout.rollout_id)] == ["ok"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "content_type", "expected"),
    [
        (b"{not json", "application/json", "not an OTLP/JSON trace export"),
        (b"\xff\xff\xff", "application/x-protobuf", "not an OTLP protobuf trace export"),
        (b"<xml/>", "text/xml", "unsupported Content-Type"),
    ],
)
async def test_bad_exports_get_a_400(server: StoreServer, content: bytes, content_type: str, expected: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.post(f"{server.url}/v1/traces", content=content, headers={"content-type": content_type})
    assert answer.status_code == 400
    assert expected in answer.json()["error"]["message"]


@pytest.mark.anyio
async def test_an_otel_exporter_sends_the_token_as_a_header_and_without_it_is_refused() -> None:
    """A store with a token takes OTLP/HTTP only from an exporter that sends it (as
    OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20..." would); without it nothing is stored."""
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    token = "otlp-secret"
    with StoreServer(MemoryStore(), watchdog_interval_s=None, token=token) as server:
        client = StoreClient(server.url, token=token)
        try:
            claim = await new_claim(client)  # type: ignore[arg-type]
            rollout_id, attempt_id = claim.rollout.rollout_id, claim.attempt.attempt_id
            finished = InMemorySpanExporter()
            provider = TracerProvider(
                resource=Resource.create({semconv.ROLLOUT_ID: rollout_id, semconv.ATTEMPT_ID: attempt_id})
            )
            provider.add_span_processor(SimpleSpanProcessor(finished))
            with provider.get_tracer("user-agent").start_as_current_span("my-agent"):
                pass
            spans = finished.get_finished_spans()
            endpoint = f"{server.url}/v1/traces"
            without = OTLPSpanExporter(endpoint=endpoint).export(spans)
            assert without is SpanExportResult.FAILURE
            assert await client.query_spans(rollout_id) == []
            with_token = OTLPSpanExporter(endpoint=endpoint, headers={"Authorization": f"Bearer {token}"})
            assert with_token.export(spans) is SpanExportResult.SUCCESS
            assert [span.name for span in await client.query_spans(rollout_id)] == ["my-agent"]
        finally:
            await client.close()
