"""What every benchmark script reports, in the format STYLE.md fixes: result rows of case, metric
and value; a Rich table, or with --json one JSON object on stdout and nothing else."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from typing import Any

import orjson

Row = dict[str, Any]


def arguments(doc: str | None, *, cases: str, repeat: int) -> argparse.ArgumentParser:
    """The options every benchmark has (--json, --repeat, --cases); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    parser.add_argument("--repeat", type=int, default=repeat, help="runs per measurement; the median is reported")
    parser.add_argument("--cases", default=cases, help="comma-separated cases")
    return parser


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, as its JSON report names it."""
    return {"cpus": os.cpu_count(), "python": platform.python_version()}


def median_row(case: str, metric: str, runs: list[float], *, digits: int = 1, show_runs: bool = True) -> Row:
    """The result row of a measurement repeated `runs` times: their median, rounded to `digits`.
    With `show_runs`, the runs go to stderr as they come (never to stdout: that is the report)."""
    value = statistics.median(runs)
    if show_runs:
        shown = ", ".join(f"{run:.{digits}f}" for run in runs)
        print(f"{case:>20} {metric:<22} median {value:12.{digits}f}  (runs: {shown})", file=sys.stderr)
    return {"case": case, "metric": metric, "value": round(value, digits)}


def emit(benchmark: str, results: list[Row], *, as_json: bool, title: str, digits: int = 1) -> None:
    """Print the report: one JSON object on stdout with `as_json`, else a Rich table titled `title`
    (values with `digits` decimals; ratios and gains with 3)."""
    if as_json:
        report = {"benchmark": benchmark, "machine": machine(), "results": results}
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{benchmark}: {title}")
    for column in ("case", "metric", "value"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for row in results:
        shown = 3 if row["metric"].endswith(("ratio", "gain")) else digits
        table.add_row(row["case"], row["metric"], f"{row['value']:,.{shown}f}")
    Console().print(table)
