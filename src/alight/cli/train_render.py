"""How `alight train` shows a run: the live dashboard on a terminal, else one JSON line per step."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from alight.config.schema import ExperimentConfig


@contextlib.contextmanager
def train_watchers(cfg: ExperimentConfig, *, dashboard: bool) -> Iterator[list[Any]]:
    """The run's watchers while it runs: the live dashboard (when asked, configured and on a
    terminal, with log lines printed above it), else the JSON-lines reporter."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the run's own progress is the dashboard (or the JSON lines)
    from alight.dashboard import JsonLinesReporter, TrainDashboard

    if not (dashboard and cfg.logging.dashboard and sys.stdout.isatty()):
        yield [JsonLinesReporter()]
        return
    console = Console()
    view = TrainDashboard(console=console)
    _log_through(console)
    with view:
        yield [view]


def _log_through(console: Console) -> None:
    """Warnings print above the live view instead of tearing it."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    level = min((h.level for h in root.handlers), default=logging.WARNING) or logging.WARNING
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    root.addHandler(RichHandler(console=console, show_path=False, level=level))
