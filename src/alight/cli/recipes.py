"""`alight recipes` and `alight init`: the shipped experiments, and a copy of one to edit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def recipes(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """List the shipped experiments, one line each: run one by name from any folder, or copy one with init.

    `alight train NAME` / `alight dev NAME` run a shipped experiment; `alight init NAME` copies it."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from alight.errors import ConfigError
    from alight.shipped import shipped_configs, shipped_root, summary

    configs = shipped_configs()
    if not configs:
        raise ConfigError("this install of alight ships no experiments (no configs/ beside the package)")
    if as_json:
        rows = [{"name": name, "config": str(path), "summary": summary(path)} for name, path in configs.items()]
        typer.echo(json.dumps({"root": str(shipped_root()), "experiments": rows}))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("what it trains")
    for name, path in configs.items():
        table.add_row(name, Text(summary(path)))
    console = Console()
    console.print(table)
    console.print("[dim]alight train NAME | alight dev NAME --n 4 | alight init NAME [FOLDER][/dim]")


def init(
    name: Annotated[str, typer.Argument(help="A shipped experiment's name (`alight recipes` lists them).")],
    folder: Annotated[
        Path | None, typer.Argument(help="Where to copy it (default: ./NAME); created if missing.", show_default=False)
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files that are already there.")] = False,
) -> None:
    """Copy a shipped experiment (its config and the recipe folders it names) into a folder, to edit and run.

    `alight init calc && alight train calc/calc.yaml`"""
    from alight.shipped import init_recipe

    target = folder if folder is not None else Path(name)
    copied = init_recipe(name, target, force=force)
    typer.echo(f"wrote {copied.config}")
    for path in copied.folders:
        typer.echo(f"wrote {path}/")
    typer.echo(f"run it: alight train {copied.config}   (or: alight dev {copied.config} --n 4)")
