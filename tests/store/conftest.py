"""The `store` fixture: every conformance test runs once per Store implementation.

`http+sqlite` and `http+memory` run the real server (uvicorn on loopback, in a thread) over
that store and talk to it through the real httpx client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from alight.store import Store
from alight.store.factory import open_store

# http+token: http+sqlite with a bearer token the client sends (see tests/serving/test_auth.py).
IMPLEMENTATIONS = ["memory", "sqlite", "http+memory", "http+sqlite", "http+token"]


def local_store(kind: str, tmp_path: Path) -> Store:
    """Each store as the factory opens it from a URL (tests/store/test_factory.py checks the kinds)."""
    return open_store("memory://" if kind == "memory" else f"sqlite://{tmp_path / 'store.db'}")


@pytest.fixture(params=IMPLEMENTATIONS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kind: str = request.param
    if not kind.startswith("http+"):
        async with local_store(kind, tmp_path) as impl:
            yield impl
        return
    from alight.store.server import StoreServer

    # The watchdog is off so the tests drive reap_timed_out themselves.
    token = "conformance-token" if kind == "http+token" else None
    inner = local_store(kind.removeprefix("http+"), tmp_path)
    with StoreServer(inner, watchdog_interval_s=None, token=token) as server:
        async with open_store(server.url, token=token) as client:
            yield client
