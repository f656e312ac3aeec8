"""What the trainer tells its watchers (the dashboard, the JSON-lines reporter, user callbacks).

A watcher implements any of the `TrainerEvents` methods; `Watchers` calls each one that exists and
logs, rather than raises, a watcher's failure: a broken display never stops a training run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class TrainerEvents(Protocol):
    """The events of a run, in order: start, (stage | rollouts | step | error)*, end."""

    def on_start(self, info: dict[str, Any]) -> None: ...
    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None: ...
    def on_rollouts(self, step: int, counts: dict[str, int]) -> None: ...
    def on_step(self, metrics: dict[str, Any]) -> None: ...
    def on_error(self, message: str) -> None: ...
    def on_end(self, summary: dict[str, Any]) -> None: ...


class Watchers:
    """Fan-out of trainer events to every watcher that handles them."""

    def __init__(self, watchers: Iterable[Any] = ()) -> None:
        self.watchers = list(watchers)

    def _emit(self, name: str, *args: Any) -> None:
        for watcher in self.watchers:
            method = getattr(watcher, name, None)
            if method is None:
                continue
            try:
                method(*args)
            except Exception:
                logger.exception("trainer watcher %r failed in %s", watcher, name)

    def on_start(self, info: dict[str, Any]) -> None:
        self._emit("on_start", info)

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any] | None = None) -> None:
        self._emit("on_stage", stage, done, total, info or {})

    def on_rollouts(self, step: int, counts: dict[str, int]) -> None:
        self._emit("on_rollouts", step, counts)

    def on_step(self, metrics: dict[str, Any]) -> None:
        self._emit("on_step", metrics)

    def on_error(self, message: str) -> None:
        self._emit("on_error", message)

    def on_end(self, summary: dict[str, Any]) -> None:
        self._emit("on_end", summary)
