"""The tracer factory: the `Tracer` a config names (`runner.tracer`), as `engines.factory` does for engines."""

from __future__ import annotations

from typing import Literal

from alight.errors import ConfigError
from alight.tracing.base import Tracer


def make_tracer(kind: Literal["light", "otel"] = "light") -> Tracer:
    """The tracer named by `kind`: "light" (no dependency) or "otel" (OpenTelemetry SDK)."""
    if kind == "light":
        from alight.tracing.light import LightTracer

        return LightTracer()
    if kind == "otel":
        from alight.tracing.otel import OtelTracer

        return OtelTracer()
    raise ConfigError(f"unknown tracer {kind!r}: choose 'light' or 'otel'")
