"""`alight dev`: load the config, run a few rollouts, show a table per rollout."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from alight.trainer.dev import DevResult


def run_dev_command(
    config: Path,
    overrides: list[str],
    *,
    n: int | None,
    endpoint: str | None,
    model: str | None,
    run_dir: Path | None,
    as_json: bool,
) -> None:
    from alight.config import load_config, to_object
    from alight.trainer.dev import run_dev, with_endpoint

    cfg = with_endpoint(to_object(load_config(config, overrides)), endpoint, model)
    where = run_dir or Path(cfg.trainer.output_dir) / f"{cfg.name}-dev-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=as_json)
    started = time.monotonic()
    with console.status("starting store, engine, proxy and runners...") as status:

        def progress(counts: dict[str, int]) -> None:
            status.update(f"rollouts ended: {counts['ended']}/{counts['total']}")

        results = run_dev(cfg, where, n=n, on_progress=progress)
    elapsed = time.monotonic() - started
    if as_json:
        print(json.dumps({"run_dir": str(where), "rollouts": [dataclasses.asdict(r) for r in results]}, default=str))
        return
    print_results(console, results)
    console.print(
        f"{len(results)} rollouts in {elapsed:.1f} s; spans kept in {where} — "
        f"[bold]alight trace {where}[/bold] shows them"
    )


def print_results(console: Console, results: list[DevResult]) -> None:
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
    for r in results:
        style = "green" if r.status == "succeeded" else "red"
        task = json.dumps(r.task, ensure_ascii=False, default=str)
        table.add_row(
            r.rollout_id,
            task if len(task) <= 40 else task[:39] + "…",
            Text(r.status + (f" ({r.attempts} tries)" if r.attempts > 1 else ""), style=style),
            "-" if r.reward is None else f"{r.reward:.3g}",
            str(r.llm_calls),
            str(r.tool_calls),
            "-" if r.duration_s is None else f"{r.duration_s:.2f} s",
            r.error or "",
        )
    console.print(table)
