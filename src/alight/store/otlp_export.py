"""Spans to OTLP/JSON (the OpenTelemetry protocol's JSON encoding), for `alight trace --otlp`.

The output loads into any OTLP/JSON consumer (an OTel Collector's file receiver, Jaeger, the
store's own `POST /v1/traces`). Alight's ids and span kind travel as span attributes
(`alight.rollout_id`, `alight.attempt_id`, `alight.span.kind`, `alight.sequence_id`); list and
object attributes become JSON strings, as they do through the OpenTelemetry tracer. Each span also
carries OpenTelemetry's GenAI attributes for what it is (`alight.store.genai.to_genai`: LLM spans
as `chat`, tools as `execute_tool`, agents as `invoke_agent`); the resource attributes a span was
received with (`resource.*`) go back on its resource, and its received events back as events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from alight import semconv
from alight.store.genai_export import to_genai
from alight.types import Span, SpanKind, SpanStatus

_STATUS_CODES = {SpanStatus.UNSET: 0, SpanStatus.OK: 1, SpanStatus.ERROR: 2}
_SPAN_KIND_INTERNAL = 1
_SPAN_KIND_CLIENT = 3


def spans_to_otlp_json(spans: Iterable[Span], *, service_name: str = "alight") -> dict[str, Any]:
    """One OTLP/JSON `ExportTraceServiceRequest` holding `spans`, one resource per distinct set of
    `resource.*` attributes (spans without any: `service.name` = `service_name`), in first-seen order."""
    groups: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for span in spans:
        resource = {
            key.removeprefix(semconv.RESOURCE_PREFIX): value
            for key, value in span.attributes.items()
            if key.startswith(semconv.RESOURCE_PREFIX)
        } or {"service.name": service_name}
        group_key = json.dumps(resource, sort_keys=True, default=str)
        groups.setdefault(group_key, (resource, []))[1].append(_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attribute(key, value) for key, value in resource.items()]},
                "scopeSpans": [{"scope": {"name": "alight"}, "spans": encoded}],
            }
            for resource, encoded in groups.values()
        ]
    }


def _span(span: Span) -> dict[str, Any]:
    own = {
        key: value
        for key, value in span.attributes.items()
        if not key.startswith(semconv.RESOURCE_PREFIX) and key != semconv.OTEL_EVENTS
    }
    attributes = {
        semconv.ROLLOUT_ID: span.rollout_id,
        semconv.ATTEMPT_ID: span.attempt_id,
        semconv.SPAN_KIND: span.kind.value,
        **({semconv.SEQUENCE_ID: span.sequence_id} if span.sequence_id is not None else {}),
        **own,
        **to_genai(span.kind, span.name, own, error=span.status is SpanStatus.ERROR),
    }
    status: dict[str, Any] = {"code": _STATUS_CODES[span.status]}
    if span.status_message:
        status["message"] = span.status_message
    encoded: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": _SPAN_KIND_CLIENT if span.kind is SpanKind.LLM else _SPAN_KIND_INTERNAL,
        "startTimeUnixNano": str(int(span.start_time * 1e9)),
        "endTimeUnixNano": str(int((span.end_time if span.end_time is not None else span.start_time) * 1e9)),
        "attributes": [_attribute(key, value) for key, value in attributes.items() if value is not None],
        "status": status,
    }
    events = span.attributes.get(semconv.OTEL_EVENTS)
    if isinstance(events, list) and events:
        encoded["events"] = [_event(event) for event in events if isinstance(event, Mapping)]
    if span.parent_id:
        encoded["parentSpanId"] = span.parent_id
    return encoded


def _event(event: Mapping[str, Any]) -> dict[str, Any]:
    attributes = event.get("attributes")
    return {
        "timeUnixNano": str(int(event.get("time_unix_nano") or 0)),
        "name": str(event.get("name") or ""),
        "attributes": [
            _attribute(key, value)
            for key, value in (attributes.items() if isinstance(attributes, Mapping) else ())
            if value is not None
        ],
    }


def _attribute(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": _value(value, as_json=key in semconv.JSON_ATTRIBUTES)}


def _value(value: Any, *, as_json: bool = False) -> dict[str, Any]:
    if as_json and not isinstance(value, str):
        return {"stringValue": json.dumps(value, ensure_ascii=False, default=str)}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list | tuple) and all(isinstance(v, str | bool | int | float) for v in value):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": json.dumps(value, ensure_ascii=False, default=str)}
