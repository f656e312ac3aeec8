"""OpenTelemetry spans to `Span` records: the store's OTLP/HTTP receiver, and the OTel tracer.

A span belongs to a rollout through `semconv.ROLLOUT_ID`/`ATTEMPT_ID`, as span or resource
attributes; its kind is `semconv.SPAN_KIND`, else what OpenTelemetry's GenAI conventions say
(`alight.store.genai`, which also adds alight's attributes for them), else inferred from its
attributes; its order is `semconv.SEQUENCE_ID` when given. Attributes in `semconv.JSON_ATTRIBUTES`
travel as JSON strings and are decoded here. The sender's resource attributes are kept on each
span under `semconv.RESOURCE_PREFIX` (`resource.service.name`, ...), its span events under
`semconv.OTEL_EVENTS`. `receive_traces` serves `POST /v1/traces` (OTLP/HTTP, protobuf or JSON).
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from alight import semconv
from alight.errors import AlightError, InvalidRequestError, PayloadTooLargeError
from alight.store import genai
from alight.store.base import Store
from alight.types import Span, SpanKind, SpanStatus

logger = logging.getLogger(__name__)

_ROUTING = (semconv.ROLLOUT_ID, semconv.ATTEMPT_ID, semconv.SPAN_KIND, semconv.SEQUENCE_ID)
_AGENT_KEYS = (semconv.GEN_AI_AGENT_NAME, semconv.PLAIN_AGENT_NAME)
_STATUS = {0: SpanStatus.UNSET, 1: SpanStatus.OK, 2: SpanStatus.ERROR}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def encode_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as OpenTelemetry can hold them: JSON attributes (and other non-scalars) as JSON text."""
    encoded: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if key in semconv.JSON_ATTRIBUTES or not isinstance(value, str | bool | int | float):
            encoded[key] = json.dumps(value, separators=(",", ":"), default=str)
        else:
            encoded[key] = value
    return encoded


def infer_kind(name: str, attributes: Mapping[str, Any]) -> SpanKind:
    """The kind of a span that does not say: from the attributes the conventions put on it."""
    if semconv.REWARD_VALUE in attributes:
        return SpanKind.REWARD
    if semconv.TOOL_NAME in attributes or "gen_ai.tool.name" in attributes:
        return SpanKind.TOOL
    if any(key.startswith(("llm.", "gen_ai.request", "gen_ai.response", "gen_ai.usage")) for key in attributes):
        return SpanKind.LLM
    if name.startswith("invoke_agent") or any(k in attributes for k in _AGENT_KEYS):
        return SpanKind.AGENT
    return SpanKind.OTHER


def make_span(
    *,
    name: str,
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    start_ns: int,
    end_ns: int | None,
    attributes: dict[str, Any],
    resource_attributes: Mapping[str, Any],
    status_code: int,
    status_message: str | None,
    events: list[dict[str, Any]] | None = None,
    validate: bool = True,
    keep_resource: bool = True,
) -> Span | None:
    """A `Span` from decoded OpenTelemetry fields, or None when no rollout/attempt id is known
    (or, with `validate`, when the fields are not a valid span). With `keep_resource`, the resource
    attributes (but the rollout/attempt ids) are kept as `resource.`-prefixed span attributes;
    `events` ({"name", "time_unix_nano", "attributes"} each) are kept in `semconv.OTEL_EVENTS`."""
    rollout_id = attributes.get(semconv.ROLLOUT_ID) or resource_attributes.get(semconv.ROLLOUT_ID)
    attempt_id = attributes.get(semconv.ATTEMPT_ID) or resource_attributes.get(semconv.ATTEMPT_ID)
    if not rollout_id or not attempt_id:
        return None
    raw_kind = attributes.get(semconv.SPAN_KIND)
    attrs = _span_attributes(attributes, resource_attributes if keep_resource else {}, events)
    genai_kind = None
    if genai.is_genai(name, attrs):
        try:
            genai_kind = genai.from_genai(name, attrs, events or ())
        except (TypeError, ValueError, AttributeError, KeyError) as err:  # a sender's odd shapes: stored as sent
            logger.debug("OTLP span %r: GenAI attributes not read: %s", name, err)
    error_type = attrs.get(semconv.ERROR_TYPE)
    if error_type is not None and status_code == 0:  # GenAI spans name their error in error.type
        status_code = 2
    if status_code == 2 and not status_message and error_type is not None:
        status_message = str(error_type)
    try:
        kind = SpanKind(raw_kind) if raw_kind is not None else genai_kind or infer_kind(name, attrs)
    except ValueError:
        kind = SpanKind.OTHER
    fields: dict[str, Any] = dict(
        rollout_id=str(rollout_id),
        attempt_id=str(attempt_id),
        sequence_id=_sequence(attributes.get(semconv.SEQUENCE_ID)),
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id or None,
        name=name,
        kind=kind,
        attributes=attrs,
        start_time=_seconds(start_ns),
        end_time=None if not end_ns else _seconds(end_ns),
        status=_STATUS.get(status_code, SpanStatus.UNSET),
        status_message=status_message or None,
    )
    if not validate:  # our own tracer's spans: every value is made by alight
        return Span.model_construct(**fields)
    try:
        return Span.model_validate(fields)
    except ValidationError as err:
        logger.debug("OTLP span %r refused: %s", name, err)
        return None


def _span_attributes(
    attributes: Mapping[str, Any], resource_attributes: Mapping[str, Any], events: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The span's attributes but the routing ids (JSON-valued ones decoded), then the resource's
    as `resource.`-prefixed ones, then the events under `semconv.OTEL_EVENTS`."""
    attrs: dict[str, Any] = {}
    for key, value in attributes.items():
        if key in _ROUTING:
            continue
        if key in semconv.JSON_ATTRIBUTES and isinstance(value, str):
            value = _json_or_text(value)
        attrs[key] = value
    for key, value in resource_attributes.items():
        if key not in _ROUTING:
            attrs.setdefault(semconv.RESOURCE_PREFIX + key, value)
    if events:
        attrs.setdefault(semconv.OTEL_EVENTS, events)
    return attrs


def _sequence(raw: Any) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError, OverflowError):
        return None


def _seconds(ns: int) -> float:
    # A time past 2^64 ns (year 2554) is no OTLP time: refused rather than an OverflowError.
    if not 0 <= ns < 2**64:
        raise InvalidRequestError(f"span time {str(ns)[:30]} ns is not an unsigned 64-bit integer")
    return ns / 1e9


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:  # plain text from a producer that did not encode it
        return value


# -- OTLP protobuf --------------------------------------------------------------------------------


def _proto_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_proto_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _proto_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, which)


def spans_from_protobuf(body: bytes) -> tuple[list[Span], int]:
    """Spans of an OTLP `ExportTraceServiceRequest` (protobuf), and how many had no rollout ids."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as err:
        raise InvalidRequestError(f"not an OTLP protobuf trace export: {err}") from None
    spans: list[Span] = []
    dropped = 0
    for resource_spans in request.resource_spans:
        resource = {kv.key: _proto_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for otlp in scope_spans.spans:
                span = make_span(
                    name=otlp.name,
                    trace_id=otlp.trace_id.hex(),
                    span_id=otlp.span_id.hex(),
                    parent_id=otlp.parent_span_id.hex() or None,
                    start_ns=otlp.start_time_unix_nano,
                    end_ns=otlp.end_time_unix_nano,
                    attributes={kv.key: _proto_value(kv.value) for kv in otlp.attributes},
                    resource_attributes=resource,
                    status_code=int(otlp.status.code),
                    status_message=otlp.status.message,
                    events=[
                        {
                            "name": event.name,
                            "time_unix_nano": event.time_unix_nano,
                            "attributes": {kv.key: _proto_value(kv.value) for kv in event.attributes},
                        }
                        for event in otlp.events
                    ],
                )
                if span is None:
                    dropped += 1
                else:
                    spans.append(span)
    return spans, dropped


# -- OTLP JSON (hex ids, lowerCamelCase, 64-bit integers as strings) ------------------------------


def _json_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_json_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return _json_attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _json_attributes(pairs: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {pair["key"]: _json_value(pair.get("value") or {}) for pair in pairs}


def _status_code(code: Any) -> int:
    if isinstance(code, str):
        return _STATUS_NAMES.get(code, int(code) if code.isdigit() else 0)
    return int(code or 0)


def spans_from_json(body: bytes) -> tuple[list[Span], int]:
    """Spans of an OTLP/JSON trace export, and how many had no rollout ids."""
    try:
        request = json.loads(body)
        spans: list[Span] = []
        dropped = 0
        for resource_spans in request.get("resourceSpans", []):
            resource = _json_attributes((resource_spans.get("resource") or {}).get("attributes", []))
            for scope_spans in resource_spans.get("scopeSpans", []):
                for otlp in scope_spans.get("spans", []):
                    status = otlp.get("status") or {}
                    span = make_span(
                        name=otlp.get("name", ""),
                        trace_id=str(otlp.get("traceId", "")).lower(),
                        span_id=str(otlp.get("spanId", "")).lower(),
                        parent_id=str(otlp.get("parentSpanId", "")).lower() or None,
                        start_ns=int(otlp.get("startTimeUnixNano", 0)),
                        end_ns=int(otlp.get("endTimeUnixNano", 0)),
                        attributes=_json_attributes(otlp.get("attributes", [])),
                        resource_attributes=resource,
                        status_code=_status_code(status.get("code", 0)),
                        status_message=status.get("message"),
                        events=[
                            {
                                "name": str(event.get("name", "")),
                                "time_unix_nano": int(event.get("timeUnixNano", 0)),
                                "attributes": _json_attributes(event.get("attributes", [])),
                            }
                            for event in otlp.get("events", [])
                        ],
                    )
                    if span is None:
                        dropped += 1
                    else:
                        spans.append(span)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as err:
        raise InvalidRequestError(f"not an OTLP/JSON trace export: {type(err).__name__}: {err}") from None
    except RecursionError:
        raise InvalidRequestError("not an OTLP/JSON trace export: nested too deeply") from None
    return spans, dropped


# -- the receiver -------------------------------------------------------------------------------


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body, decompressed by streaming: PayloadTooLargeError past `max_bytes` (a zip bomb
    never takes more memory than the limit)."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in _WBITS:
        raise InvalidRequestError(f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(_WBITS[encoding])
    try:
        data = inflater.decompress(body, max_bytes + 1)
        if len(data) <= max_bytes and not inflater.eof:
            data += inflater.flush()
    except zlib.error as err:
        raise InvalidRequestError(f"cannot decompress the {encoding} body: {err}") from None
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise PayloadTooLargeError(f"the {encoding} body decompresses past the limit of {max_bytes} bytes")
    if not inflater.eof:
        raise InvalidRequestError(f"cannot decompress the {encoding} body: it ends early")
    return data


async def receive_traces(
    store: Store,
    body: bytes,
    content_type: str | None,
    content_encoding: str | None = None,
    *,
    max_bytes: int,
    check: Callable[[list[Span]], Awaitable[None]] | None = None,
) -> tuple[bytes, str]:
    """Store the spans of an OTLP/HTTP trace export; returns (answer body, its media type).
    A compressed body may decompress to `max_bytes` at most (PayloadTooLargeError beyond).
    `check` sees every span before any is stored, and refuses the whole export by raising
    (ForbiddenError: the sender may not write into an attempt it names).

    Spans without rollout/attempt ids, or of attempts the store does not know, are rejected and
    counted in the answer's partial success (the rest are stored)."""
    media = (content_type or "").split(";")[0].strip().lower()
    is_json = media == "application/json"
    if not is_json and media not in ("application/x-protobuf", "application/protobuf", ""):
        raise InvalidRequestError(f"unsupported Content-Type {content_type!r}: send application/x-protobuf or JSON")
    data = _decompress(body, content_encoding, max_bytes)
    spans, rejected = spans_from_json(data) if is_json else spans_from_protobuf(data)
    messages: list[str] = []
    if rejected:
        messages.append(f"{rejected} span(s) carry no valid {semconv.ROLLOUT_ID}/{semconv.ATTEMPT_ID}")
    if check is not None:
        await check(spans)
    by_attempt: dict[str, list[Span]] = {}
    for span in spans:
        by_attempt.setdefault(span.attempt_id, []).append(span)
    for attempt_id, group in by_attempt.items():
        try:
            await store.add_spans(group)
        except AlightError as err:
            rejected += len(group)
            messages.append(f"attempt {attempt_id}: {err}")
    if rejected:
        logger.warning("OTLP receiver: rejected %d span(s): %s", rejected, "; ".join(messages))
    message = "; ".join(messages)[:1000]
    if is_json:
        answer: dict[str, Any] = {}
        if rejected:
            answer["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
        return json.dumps(answer).encode(), "application/json"
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return response.SerializeToString(), "application/x-protobuf"
