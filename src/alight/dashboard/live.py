"""`TrainDashboard`: the live terminal view of a training run (a Rich `Live` around `RunState`)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live

from alight.dashboard.panels import build_view
from alight.dashboard.state import RunState


class TrainDashboard:
    """Live view of a run: header, reward chart, rollouts, throughput, step time, actor, errors.

    Use as a context manager around the run and feed it the trainer's events (`on_start`,
    `on_stage`, `on_rollouts`, `on_step`, `on_error`, `on_end`); events may come from any
    thread. The layout follows the terminal's size on each refresh, so it shrinks to narrow
    terminals. Printing the object renders the current frame.
    """

    def __init__(self, console: Console | None = None, refresh_per_second: float = 4) -> None:
        self.console = console or Console()
        self._state = RunState()
        self._lock = threading.Lock()
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second)
        self._running = False

    def __enter__(self) -> TrainDashboard:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if not self._running:
            self._live.start()
            self._running = True

    def stop(self) -> None:
        """Stop refreshing; the last frame stays on the terminal."""
        if self._running:
            self._running = False
            self._live.stop()

    def on_start(self, info: dict[str, Any]) -> None:
        with self._lock:
            self._state.start(info)
        self._refresh()

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        with self._lock:
            self._state.on_stage(stage, done, total, info)

    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        with self._lock:
            self._state.on_rollouts(step, counts)

    def on_step(self, metrics: dict[str, Any]) -> None:
        with self._lock:
            self._state.on_step(metrics)
        self._refresh()

    def on_error(self, message: str) -> None:
        with self._lock:
            self._state.on_error(message)

    def on_end(self, summary: dict[str, Any]) -> None:
        with self._lock:
            self._state.on_end(summary)
        self._refresh()

    def _refresh(self) -> None:
        if self._running:
            self._live.refresh()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        with self._lock:
            view = build_view(self._state, options.max_width, options.size.height)
        yield view
