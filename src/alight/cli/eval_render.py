"""How `alight eval` shows its report: a progress line per model while it runs, then a table of the
models (mean ± interval, pass@k, difference against the first), each task's rewards with
--per-task, or one JSON object."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from alight.cli.trace_render import printable
from alight.trainer.evaluation import EvalModel, EvalReport, report_json


@contextmanager
def progress(*, quiet: bool) -> Iterator[Callable[[EvalModel, int, int], None]]:
    """A callback for `run_eval` that shows one progress line per model (rollouts ended / total) on
    stderr; with `quiet`, one that shows nothing."""
    if quiet:
        yield lambda model, ended, total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        lines: dict[int, TaskID] = {}

        def update(model: EvalModel, ended: int, total: int) -> None:
            if id(model) not in lines:
                lines[id(model)] = bar.add_task(printable(model.label), total=total)
            bar.update(lines[id(model)], completed=ended, total=total)

        yield update


def eval_report(report: EvalReport, *, as_json: bool, per_task: bool) -> None:
    """The report: one JSON object on stdout, or the models' table (then each task's rewards)."""
    if as_json:
        print(json.dumps(report_json(report), default=str))
        return
    console = Console()
    level = f"{report.confidence:.0%}"
    table = Table(
        title=f"alight eval: {len(report.tasks)} tasks of {printable(report.source)}, n={report.n},"
        f" temperature {report.temperature:g}",
        title_justify="left",
    )
    for column in ("model", f"mean reward ({level} CI)", *(f"pass@{k}" for k in report.ks)):
        table.add_column(column, no_wrap=column != "model", overflow="fold")
    table.add_column(f"vs {printable(report.models[0].label)} ({level} CI, P(≤0))", no_wrap=True)
    table.add_column("failed", justify="right")
    for model in report.models:
        assert model.mean is not None
        mean = f"{model.mean.value:.3f} [{model.mean.low:.3f}, {model.mean.high:.3f}]"
        diff = model.difference
        versus = (
            "-"
            if diff is None
            else f"{diff.value:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] {diff.share_not_better:.3f}"
        )
        failed = Text(f"{model.failed}/{report.n * len(report.tasks)}", style="red" if model.failed else "")
        passes = (f"{model.pass_at_k[k]:.3f}" for k in report.ks)
        table.add_row(Text(printable(model.label)), mean, *passes, versus, failed)
    console.print(table)
    if per_task:
        console.print(_per_task_table(report))
    for index, model in enumerate(report.models):
        for error in model.errors:
            console.print(f"[red]model {index + 1}: {printable(error)}[/red]")
    console.print(
        f"a failed rollout scores 0; success: reward >= {report.success:g}; bootstrap: {report.resamples}"
        f" resamples of the tasks, seed {report.seed}. Stores in {report.run_dir} (alight trace reads them)"
    )


def _per_task_table(report: EvalReport) -> Table:
    table = Table(title="per task (each sample's reward)", title_justify="left")
    table.add_column("task", overflow="fold")
    for model in report.models:
        table.add_column(printable(model.label), overflow="fold")
    for index, name in enumerate(report.names):
        cells = (" ".join(f"{r:.3g}" for r in model.rewards[index]) for model in report.models)
        table.add_row(Text(printable(name)), *cells)
    return table
