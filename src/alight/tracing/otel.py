"""The OpenTelemetry tracer: spans made with the OpenTelemetry SDK, batched into the store.

Each alight span is an OTel span carrying the rollout/attempt ids, kind and sequence number as
attributes; a span processor turns every ended span into a `Span` (the same conversion as the
OTLP receiver) and buffers it in its attempt until `flush()`. Pass your own SDK `TracerProvider`
to also capture spans that other OTel instrumentation makes inside an attempt: the processor
stamps them with the attempt's ids and order when they start. (This module imports the SDK:
`alight.tracing` loads it only when an `OtelTracer` is asked for.)
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import Status, StatusCode

from alight import semconv
from alight.store.base import Store
from alight.store.otlp import encode_attributes, make_span
from alight.tracing.base import Tracer
from alight.tracing.context import ActiveSpan, AttemptContext, current_frame
from alight.types import SpanStatus

logger = logging.getLogger(__name__)


def span_from_readable(span: ReadableSpan) -> Any:
    """The `Span` record of an ended OTel SDK span (None without rollout/attempt ids)."""
    context = span.context
    parent = span.parent
    return make_span(
        name=span.name,
        trace_id=format(context.trace_id, "032x") if context is not None else "",
        span_id=format(context.span_id, "016x") if context is not None else "",
        parent_id=format(parent.span_id, "016x") if parent is not None else None,
        start_ns=span.start_time or 0,
        end_ns=span.end_time,
        attributes=dict(span.attributes or {}),
        resource_attributes=dict(span.resource.attributes) if span.resource is not None else {},
        status_code=span.status.status_code.value,
        status_message=span.status.description,
        validate=False,
        keep_resource=False,  # in-process spans: no sender's resource to keep
    )


class _OtelAttempt(AttemptContext):
    def __init__(self, tracer: OtelTracer, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> None:
        super().__init__(store, rollout_id, attempt_id, agent_name)
        self._tracer = tracer

    def _open(self, span: ActiveSpan) -> None:
        parent = span.parent
        context = trace.set_span_in_context(parent.native) if parent is not None and parent.native else Context()
        native = self._tracer.otel_tracer.start_span(
            span.name,
            context=context,
            attributes={
                semconv.ROLLOUT_ID: self.rollout_id,
                semconv.ATTEMPT_ID: self.attempt_id,
                semconv.SPAN_KIND: span.kind.value,
                semconv.SEQUENCE_ID: span.sequence_id,
            },
            start_time=int(span.start_time * 1e9),
        )
        span_context = native.get_span_context()
        span.native = native
        span.span_id = format(span_context.span_id, "016x")
        span.trace_id = format(span_context.trace_id, "032x")

    def _close(self, span: ActiveSpan, status: SpanStatus, message: str | None, end_time: float) -> None:
        native = span.native
        # The sequence number may have been fixed after the span opened (the openai instrumentation).
        native.set_attribute(semconv.SEQUENCE_ID, span.sequence_id)
        native.set_attributes(encode_attributes(span.attributes))
        if status is SpanStatus.ERROR:
            native.set_status(Status(StatusCode.ERROR, message))
        elif status is SpanStatus.OK:
            native.set_status(Status(StatusCode.OK))
        native.end(end_time=int(end_time * 1e9))  # the processor files it in this attempt


class OtelTracer(Tracer):
    """A tracer on the OpenTelemetry SDK (a private `TracerProvider` unless you pass one)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.attempts: dict[str, AttemptContext] = {}
        self.provider = tracer_provider if tracer_provider is not None else TracerProvider()
        self.provider.add_span_processor(_StoreSpanProcessor(self.attempts))
        self.otel_tracer = self.provider.get_tracer("alight")

    def _new_attempt(self, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> AttemptContext:
        ctx = _OtelAttempt(self, store, rollout_id, attempt_id, agent_name)
        self.attempts[attempt_id] = ctx
        return ctx

    def _end_attempt(self, ctx: AttemptContext) -> None:
        self.attempts.pop(ctx.attempt_id, None)


class _StoreSpanProcessor(SpanProcessor):
    """Files ended spans in their attempt's buffer; stamps foreign spans started in an attempt."""

    def __init__(self, attempts: dict[str, AttemptContext]) -> None:
        self.attempts = attempts

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        attributes = span.attributes or {}
        if semconv.ATTEMPT_ID in attributes:
            return
        frame = current_frame()
        if frame is None or frame.attempt.attempt_id not in self.attempts:
            return
        # The agent a GenAI span names (or its foreign parent was given), else the alight agent running.
        agent = attributes.get(semconv.GEN_AI_AGENT_NAME) or attributes.get(semconv.PLAIN_AGENT_NAME)
        if agent is None:
            parent = trace.get_current_span(parent_context)
            agent = (getattr(parent, "attributes", None) or {}).get(semconv.AGENT_NAME) or frame.agent_name
        span.set_attributes(
            {
                semconv.ROLLOUT_ID: frame.attempt.rollout_id,
                semconv.ATTEMPT_ID: frame.attempt.attempt_id,
                semconv.SEQUENCE_ID: frame.attempt.next_sequence_id(),
                semconv.AGENT_NAME: str(agent),
            }
        )

    def on_end(self, span: ReadableSpan) -> None:
        record = span_from_readable(span)
        if record is None:
            return
        ctx = self.attempts.get(record.attempt_id)
        if ctx is None:
            logger.debug("OTel span %r ended after its attempt %s: dropped", span.name, record.attempt_id)
            return
        ctx._finished.append(record)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
