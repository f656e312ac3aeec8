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
from alight.commands.evaluation import EvalModel, EvalReport, report_json


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
    table.add_column("")
    for index in range(len(report.models)):
        table.add_column(f"#{index + 1}", no_wrap=True)
    total = report.n * len(report.tasks)
    means = [m.mean for m in report.models]
    diffs = [m.difference for m in report.models]
    table.add_row(f"mean reward ({level} CI)", *(f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]" for i in means if i))
    for k in report.ks:
        table.add_row(f"pass@{k}", *(f"{m.pass_at_k[k]:.3f}" for m in report.models))
    if len(report.models) > 1:
        table.add_row(
            f"vs #1 ({level} CI, paired)",
            *("-" if d is None else f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" for d in diffs),
        )
        table.add_row("share of resamples ≤ 0", *("-" if d is None else f"{d.share_not_better:.3f}" for d in diffs))
    failed = (Text(f"{m.failed}/{total}", style="red" if m.failed else "") for m in report.models)
    table.add_row("failed rollouts (scored 0)", *failed)
    console.print(table)
    for index, model in enumerate(report.models):
        console.print(
            Text(
                f"#{index + 1}: {printable(model.label)}"
                + (f" → {printable(model.served)}" if model.served != model.label else "")
            )
        )
    if per_task:
        console.print(_per_task_table(report))
    for index, model in enumerate(report.models):
        for error in model.errors:
            console.print(Text(f"#{index + 1}: {printable(error)}", style="red"))
    console.print(
        f"success: reward >= {report.success:g}; bootstrap: {report.resamples}"
        f" resamples of the tasks, seed {report.seed}. Stores in {report.run_dir} (alight trace reads them)"
    )


def _per_task_table(report: EvalReport) -> Table:
    table = Table(title="per task: each sample's reward", title_justify="left")
    table.add_column("task", overflow="fold")
    for index in range(len(report.models)):
        table.add_column(f"#{index + 1}", overflow="fold")
    for index, name in enumerate(report.names):
        cells = (" ".join(f"{r:.3g}" for r in model.rewards[index]) for model in report.models)
        table.add_row(Text(printable(name)), *cells)
    return table
