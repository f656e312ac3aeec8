"""How `alight dev` shows its rollouts: one table row each, or one JSON object."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from alight.cli.trace_render import printable
from alight.trainer.tasks import DevRun


def dev_run(console: Console, run: DevRun, *, as_json: bool) -> None:
    """The dev rollouts: a table, then where their spans are kept."""
    if as_json:
        rows = [dataclasses.asdict(r) for r in run.results]
        report = {
            "run_dir": str(run.run_dir),
            "split": run.split,
            "model": run.model,
            "tasks": len(run.results),
            "succeeded": run.succeeded,
            "mean_reward": run.mean_reward,
            "rollouts": rows,
        }
        print(json.dumps(report, default=str))
        return
    table = Table(title="alight dev", title_justify="left")
    for column in ("rollout", "task", "status", "reward", "LLM calls", "tool calls", "time", "error"):
        # Ids, statuses and numbers stay whole on one line; the task is cut short; errors wrap.
        table.add_column(
            column,
            no_wrap=column != "error",
            overflow="fold" if column == "error" else "ellipsis",
            max_width=28 if column == "task" else None,
            min_width=len(column) if column not in ("task", "error") else None,
        )
    for r in run.results:
        style = "green" if r.status == "succeeded" else "red"
        task = json.dumps(r.task, ensure_ascii=False, default=str)
        table.add_row(
            Text(printable(r.rollout_id)),
            Text(printable(task if len(task) <= 40 else task[:39] + "…")),
            Text(r.status + (f" ({r.attempts} tries)" if r.attempts > 1 else ""), style=style),
            "-" if r.reward is None else f"{r.reward:.3g}",
            str(r.llm_calls),
            str(r.tool_calls),
            "-" if r.duration_s is None else f"{r.duration_s:.2f} s",
            Text(printable(r.error or "")),
        )
    console.print(table)
    if run.mean_reward is not None:
        console.print(
            f"mean reward [bold]{run.mean_reward:.4g}[/bold] over {len(run.results)} {run.split} tasks"
            f" ({run.succeeded} succeeded; a failed rollout counts 0), model {printable(run.model)}"
        )
    console.print(
        f"{len(run.results)} rollouts in {run.elapsed_s:.1f} s; spans kept in {run.run_dir} — "
        f"[bold]alight trace {run.run_dir}[/bold] shows them"
    )
