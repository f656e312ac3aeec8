"""The store factory: each kind from a `store` config section and from a URL, and one-line errors
for a bad kind, URL or path, before anything is opened. The conformance suite (conftest.py) runs
on stores the factory opened from URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.config.schema import StoreConfig
from alight.errors import ConfigError
from alight.store.base import Store
from alight.store.client import StoreClient
from alight.store.factory import check_store, open_store
from alight.store.memory import MemoryStore
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.types import Rollout, Task

pytestmark = pytest.mark.anyio


async def _round_trip(writer: Store, reader: Store) -> None:
    """A rollout enqueued through `writer` is read back through `reader`."""
    [rollout] = await writer.enqueue([Rollout(task=Task(input={"question": "1+1"}))])
    got = await reader.get_rollout(rollout.rollout_id)
    assert got.task.input == {"question": "1+1"}


async def test_sqlite_from_the_config_opens_its_path_or_the_default(tmp_path: Path) -> None:
    default = tmp_path / "run" / "store.db"
    async with open_store(StoreConfig(), default_path=default) as store:  # the default: sqlite, today's file
        assert isinstance(store, SqliteStore) and store.path == default
        async with open_store(StoreConfig(kind="sqlite"), default_path=default) as second:  # one file, two connections
            await _round_trip(store, second)
    chosen = tmp_path / "elsewhere" / "mine.db"
    async with open_store(StoreConfig(path=str(chosen)), default_path=default) as store:
        assert isinstance(store, SqliteStore) and store.path == chosen and chosen.is_file()


async def test_sqlite_from_a_url_and_read_only_opens_need_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "store.db"
    with pytest.raises(ConfigError, match="no store file there"):
        open_store(f"sqlite://{path}", create=False)
    assert not path.exists()  # refused before SQLite made the file
    async with open_store(f"sqlite://{path}") as store:
        assert isinstance(store, SqliteStore) and store.path == path
        async with open_store(f"sqlite://{path}", create=False) as reader:
            await _round_trip(store, reader)


async def test_memory_from_the_config_and_from_a_url() -> None:
    for spec in (StoreConfig(kind="memory"), "memory://"):
        async with open_store(spec) as store:
            assert isinstance(store, MemoryStore)
            await _round_trip(store, store)


async def test_http_from_the_config_a_bare_url_and_store_url_alone() -> None:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        specs = (StoreConfig(kind="http", url=server.url), StoreConfig(url=server.url), server.url)
        first = open_store(specs[0], max_retries=1)
        assert isinstance(first, StoreClient) and first.max_retries == 1
        async with first:
            for spec in specs:
                async with open_store(spec) as client:
                    assert isinstance(client, StoreClient) and client.url == server.url
                    await _round_trip(first, client)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (StoreConfig(kind="redis"), "store.kind='redis': expected one of sqlite, memory, http"),
        (StoreConfig(kind="http"), "store.kind=http needs store.url"),
        (StoreConfig(kind="http", url="sqlite:///tmp/x.db"), "store.kind=http needs http://HOST:PORT"),
        (StoreConfig(kind="http", url="localhost:4747"), "store.url 'localhost:4747': expected sqlite:///PATH"),
        (StoreConfig(kind="sqlite", url="http://h:1"), "store.url is set but store.kind=sqlite"),
        (StoreConfig(kind="memory", url="http://h:1"), "store.url is set but store.kind=memory"),
        (StoreConfig(kind="memory", path="x.db"), "store.path is set but store.kind=memory"),
        ("redis://h:6379", "store URL 'redis://h:6379': expected sqlite:///PATH, memory:// or http://HOST:PORT"),
        ("runs/store.db", "store URL 'runs/store.db': expected"),
        ("http://", "store URL 'http://': expected"),
        ("http://h:port", "store URL 'http://h:port': expected"),
        ("sqlite://", "store URL 'sqlite://': expected"),
        ("sqlite://host/store.db", "store URL 'sqlite://host/store.db': expected"),
        ("sqlite:///x.db?mode=ro", "expected"),
        ("memory://somewhere", "store URL 'memory://somewhere': expected"),
    ],
)
def test_a_bad_kind_or_url_is_one_line(spec: StoreConfig | str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_store(spec)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ConfigError):
        open_store(spec)


def test_sqlite_with_no_path_and_no_default_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^store.kind=sqlite needs store.path"):
        open_store(StoreConfig())
