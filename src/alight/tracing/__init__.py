"""Tracing: record what an agent does (LLM calls, tools, rewards) as spans in the store.

Two tracers make the same `Span` records: `LightTracer` (no dependency) and `OtelTracer`
(OpenTelemetry SDK). `Tracer.instrument()` hooks openai, LangChain/LangGraph, the OpenAI
Agents SDK, AutoGen AgentChat and CrewAI so agent code needs no alight call; `emit_reward`,
`emit_tool` and `emit_exception` work anywhere inside a rollout. The store server also receives
OTLP/HTTP (`alight.store.otlp`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alight.tracing.base import Tracer
from alight.tracing.context import (
    ActiveSpan,
    AttemptContext,
    agent_scope,
    current_attempt,
    emit_exception,
    emit_reward,
    emit_tool,
)
from alight.tracing.factory import make_tracer
from alight.tracing.light import LightTracer

if TYPE_CHECKING:
    from alight.tracing.otel import OtelTracer

__all__ = [
    "ActiveSpan",
    "AttemptContext",
    "LightTracer",
    "OtelTracer",
    "Tracer",
    "agent_scope",
    "current_attempt",
    "emit_exception",
    "emit_reward",
    "emit_tool",
    "make_tracer",
]


def __getattr__(name: str) -> Any:
    # OtelTracer imports the OpenTelemetry SDK: load it on first use only.
    if name == "OtelTracer":
        from alight.tracing.otel import OtelTracer

        return OtelTracer
    raise AttributeError(f"module 'alight.tracing' has no attribute {name!r}")
