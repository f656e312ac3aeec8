"""A real store server (SQLite in a temporary folder, watchdog on) for the pool tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

AGENTS = str(Path(__file__).with_name("agents.py"))


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[object]:
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    with StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=0.5) as server:
        yield server
