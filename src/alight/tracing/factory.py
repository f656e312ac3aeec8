"""The tracer kinds by name (`TRACERS`, `runner.tracer`) and `make_tracer`, as `engines.factory`
does for engines. A kind's module is imported when the kind is chosen (otel needs the
OpenTelemetry SDK); a new tracer is a `Tracer` subclass plus one `TRACERS.register` call."""

from __future__ import annotations

from alight.errors import ConfigError
from alight.parts import Registry
from alight.tracing.base import Tracer

#: The tracer kinds (`runner.tracer`), the default first.
TRACERS: Registry[Tracer] = Registry(
    "runner.tracer",
    {
        "light": "alight.tracing.light:LightTracer",
        "otel": "alight.tracing.otel:OtelTracer",
    },
)


def make_tracer(kind: str = "light") -> Tracer:
    """The tracer named by `kind`: "light" (no dependency) or "otel" (OpenTelemetry SDK), or a
    kind registered in `TRACERS`."""
    if kind not in TRACERS:
        raise ConfigError(f"unknown tracer {kind!r}: choose {' or '.join(repr(name) for name in TRACERS)}")
    return TRACERS.get(kind)()
