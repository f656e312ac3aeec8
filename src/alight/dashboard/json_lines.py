"""`JsonLinesReporter`: one JSON object per line on stdout, for scripts (`alight train --json`)."""

from __future__ import annotations

import json
import math
import numbers
import sys
import time
from typing import Any, TextIO


class JsonLinesReporter:
    """Writes compact JSON lines to `stream`: `{"event": "start", ...}` first, then the stages of
    the run (`{"event": "stage", "stage", "done", "total", "elapsed_s", ...}`: when one begins, when
    its work is all done, and at most every `stage_every_s` seconds in between; a stage ends when the
    next one or a step begins), one line per step (its metrics, with `step`, no `event`), and a
    final `{"event": "end", ...}`.

    Nothing else goes to `stream`, so a script can parse it line by line; failed rollouts'
    errors go to `err_stream` as plain lines starting with "alight: ".
    """

    def __init__(
        self, stream: TextIO | None = None, err_stream: TextIO | None = None, *, stage_every_s: float = 5.0
    ) -> None:
        self._stream = stream or sys.stdout
        self._err = err_stream or sys.stderr
        self._stage_every_s = stage_every_s
        self._started = time.monotonic()
        self._stage: tuple[str, float] | None = None  # the current stage and when its last line was written

    def on_start(self, info: dict[str, Any]) -> None:
        self._started = time.monotonic()
        self._write({"event": "start", **{k: v for k, v in info.items() if k != "history"}})

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        now = time.monotonic()
        new = self._stage is None or self._stage[0] != stage
        if new or done >= total or now - (self._stage[1] if self._stage else now) >= self._stage_every_s:
            self._stage = (stage, now)
            row = {"event": "stage", "stage": stage, "done": done, "total": total, **info}
            self._write({**row, "elapsed_s": round(now - self._started, 1)})

    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        pass

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._stage = None
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
