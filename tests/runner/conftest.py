"""A real store server (SQLite in a temporary folder, watchdog on) for the pool tests, and a local
Ray cluster for the Ray pool's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

AGENTS = str(Path(__file__).with_name("agents.py"))
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[object]:
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    with StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=0.5) as server:
        yield server


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    """A local Ray cluster of 2 CPUs for one test module, shut down after it. Its workers import
    this checkout (`tests.` included); RAY_AUTH_MODE=disabled keeps Ray from writing an auth
    token under the home folder."""
    ray = pytest.importorskip("ray")
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "PYTHONPATH")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    paths = [str(REPO), str(REPO / "src"), *filter(None, (saved["PYTHONPATH"] or "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
