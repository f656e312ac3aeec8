"""The light tracer: spans built directly as `Span` records, no OpenTelemetry needed.

Its hot path is a context variable lookup, a counter and one `Span.model_construct` per span
(no validation: every value is made by alight itself).
"""

from __future__ import annotations

import os

from alight.store.base import Store
from alight.tracing.base import Tracer
from alight.tracing.context import ActiveSpan, AttemptContext
from alight.types import Span, SpanStatus


class _LightAttempt(AttemptContext):
    def __init__(self, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> None:
        super().__init__(store, rollout_id, attempt_id, agent_name)
        self.trace_id = os.urandom(16).hex()

    def _open(self, span: ActiveSpan) -> None:
        span.span_id = os.urandom(8).hex()
        span.trace_id = self.trace_id

    def _close(self, span: ActiveSpan, status: SpanStatus, message: str | None, end_time: float) -> None:
        self._finished.append(
            Span.model_construct(
                rollout_id=self.rollout_id,
                attempt_id=self.attempt_id,
                sequence_id=span.sequence_id,
                trace_id=span.trace_id,
                span_id=span.span_id,
                parent_id=None if span.parent is None else span.parent.span_id,
                name=span.name,
                kind=span.kind,
                attributes=span.attributes,
                start_time=span.start_time,
                end_time=end_time,
                status=status,
                status_message=message,
            )
        )


class LightTracer(Tracer):
    """A tracer with no dependency: context variables and `Span` records."""

    def _new_attempt(self, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> AttemptContext:
        return _LightAttempt(store, rollout_id, attempt_id, agent_name)
