"""`JsonLinesReporter`: one JSON object per step on stdout, for scripts (`alight train --json`)."""

from __future__ import annotations

import json
import math
import numbers
import sys
from typing import Any, TextIO


class JsonLinesReporter:
    """Writes one compact JSON line per step and a final `{"event": "end", ...}` line to `stream`.

    Nothing else goes to `stream`, so a script can parse it line by line; failed rollouts'
    errors go to `err_stream` as plain lines starting with "alight: ".
    """

    def __init__(self, stream: TextIO | None = None, err_stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._err = err_stream or sys.stderr

    def on_start(self, info: dict[str, Any]) -> None:
        pass

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        pass

    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        pass

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._write(metrics)

    def on_error(self, message: str) -> None:
        lines = message.strip().splitlines()
        self._err.write(f"alight: {lines[-1] if lines else 'rollout failed'}\n")
        self._err.flush()

    def on_end(self, summary: dict[str, Any]) -> None:
        self._write({"event": "end", **summary})

    def _write(self, row: dict[str, Any]) -> None:
        line = json.dumps({str(k): clean(v) for k, v in row.items()}, separators=(",", ":"), allow_nan=False)
        self._stream.write(line + "\n")
        self._stream.flush()


def clean(value: Any) -> Any:
    """`value` ready for strict JSON: floats to 6 significant digits, NaN/inf as None, paths as text."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):  # int, numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # float, numpy floats
        number = float(value)
        return float(f"{number:.6g}") if math.isfinite(number) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return str(value)
