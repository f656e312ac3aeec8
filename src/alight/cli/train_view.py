"""`alight train`: load the experiment, show the live dashboard (or JSON lines), run `Trainer.fit`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rich.console import Console


def run_train_command(
    config: Path, overrides: list[str], *, show_cfg: bool, resume: bool, run_dir: Path | None, dashboard: bool
) -> int:
    """Run (or with `show_cfg` print) the experiment; returns the exit code (130 when interrupted)."""
    from alight.config import load_config, to_object
    from alight.config.loading import to_yaml

    loaded = load_config(config, overrides)
    if show_cfg:
        sys.stdout.write(to_yaml(loaded))
        return 0
    cfg = to_object(loaded)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the run's own progress is the dashboard (or the JSON lines)
    from alight.dashboard import JsonLinesReporter, TrainDashboard
    from alight.trainer.trainer import Trainer

    live = dashboard and cfg.logging.dashboard and sys.stdout.isatty()
    if not live:
        result = Trainer(cfg, run_dir=run_dir, resume=resume, watchers=[JsonLinesReporter()]).fit()
        return 130 if result.stopped else 0
    console = Console()
    view = TrainDashboard(console=console)
    _log_through(console)
    with view:
        result = Trainer(cfg, run_dir=run_dir, resume=resume, watchers=[view]).fit()
    return 130 if result.stopped else 0


def _log_through(console: Console) -> None:
    """Warnings print above the live view instead of tearing it."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    level = min((h.level for h in root.handlers), default=logging.WARNING) or logging.WARNING
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    root.addHandler(RichHandler(console=console, show_path=False, level=level))
