"""OpenAI Agents SDK instrumentation: a trace processor for agent and tool spans.

Inside an attempt, each SDK agent run is an AGENT span (and the LLM calls it makes are attributed
to it: the openai instrumentation or the proxy records them, so generation spans are ignored),
and each function tool call is a TOOL span. `instrument_openai_agents()` registers the processor
and, unless ALIGHT_OPENAI_TRACE_EXPORT=1, removes the SDK's default exporter to OpenAI's servers
(it would warn on every export, or retry against an unreachable network).
(This module imports `agents`: `alight.tracing` loads it only when asked.)
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from agents.tracing import Span, Trace, TracingProcessor, get_trace_provider, set_trace_processors
from agents.tracing.processors import default_processor
from agents.tracing.span_data import AgentSpanData, FunctionSpanData

from alight.tracing.context import ActiveSpan, _Frame, current_frame, enter_agent, exit_agent, tool_attributes
from alight.types import SpanKind, SpanStatus

logger = logging.getLogger(__name__)

#: Set to 1 to keep the Agents SDK's own export of traces to OpenAI.
KEEP_EXPORT_ENV = "ALIGHT_OPENAI_TRACE_EXPORT"
_installed = False


class AlightTraceProcessor(TracingProcessor):
    """Maps Agents SDK spans to alight spans while an attempt runs."""

    def __init__(self) -> None:
        self._agents: dict[str, _Frame] = {}
        self._tools: dict[str, ActiveSpan] = {}
        self._lock = threading.Lock()

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            frame = enter_agent(data.name)
            if frame is not None:
                with self._lock:
                    self._agents[span.span_id] = frame
        elif isinstance(data, FunctionSpanData):
            frame = current_frame()
            if frame is None:
                return
            active = frame.attempt.start_span(data.name, SpanKind.TOOL, tool_attributes(data.name, None, None))
            with self._lock:
                self._tools[span.span_id] = active

    def on_span_end(self, span: Span[Any]) -> None:
        with self._lock:
            frame = self._agents.pop(span.span_id, None)
            active = self._tools.pop(span.span_id, None)
        error = span.error
        message = None if error is None else str(error.get("message") or "error")
        data = span.span_data
        if frame is not None:
            exit_agent(frame, message)
        if active is not None and isinstance(data, FunctionSpanData):
            call_id = active.attempt.claim_tool_call(data.name, data.input)
            active.attributes.update(
                tool_attributes(data.name, data.input, data.output, error=error is not None, call_id=call_id)
            )
            if message is None:
                active.end()
            else:
                active.end(SpanStatus.ERROR, message)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def instrument_openai_agents() -> bool:
    """Register the processor with the Agents SDK (once per process)."""
    global _installed
    if _installed:
        return True
    processor = AlightTraceProcessor()
    if os.environ.get(KEEP_EXPORT_ENV) == "1":
        get_trace_provider().register_processor(processor)
    else:
        multi = getattr(get_trace_provider(), "_multi_processor", None)
        current = list(getattr(multi, "_processors", ()))
        default = default_processor()
        set_trace_processors([p for p in current if p is not default] + [processor])
    _installed = True
    return True
