"""`alight` Typer app. Commands import what they need inside their body so `alight --help` stays fast."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from alight import __version__
from alight.errors import AlightError

app = typer.Typer(
    name="alight",
    help="Train the LLM inside any AI agent with reinforcement learning, without rewriting the agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"alight {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def store(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port to listen on.")] = 4747,
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes the store to other machines.")] = (
        "127.0.0.1"
    ),
    db: Annotated[
        Path | None,
        typer.Option(help="SQLite file to keep the store in (durable). Without it the store lives in memory."),
    ] = None,
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body accepted, in MiB.")] = 32.0,
    watchdog_interval: Annotated[
        float, typer.Option(min=0.05, help="Seconds between checks for attempts that missed their heartbeat.")
    ] = 1.0,
) -> None:
    """Run a standalone store server, for runners on other machines."""
    from alight.store.memory import MemoryStore
    from alight.store.server import serve
    from alight.store.sqlite import SqliteStore

    backing = SqliteStore(db) if db is not None else MemoryStore()
    where = f"SQLite file {db}" if db is not None else "memory (lost when the server stops; use --db to keep it)"

    def ready(url: str) -> None:
        typer.echo(f"alight store serving on {url}, keeping rollouts in {where}; Ctrl-C stops it", err=True)

    serve(
        backing,
        host=host,
        port=port,
        max_body_bytes=int(max_body_mb * 2**20),
        watchdog_interval_s=watchdog_interval,
        on_ready=ready,
    )


def main() -> None:
    """Console entry point: user errors print one line and exit with code 2."""
    try:
        app()
    except AlightError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
