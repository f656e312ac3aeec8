"""Stores: the in-memory, SQLite and HTTP implementations of one `Store` protocol."""

from __future__ import annotations

from alight.store.base import ALL_ATTEMPTS, LATEST_ATTEMPT, Store
from alight.store.memory import MemoryStore

__all__ = ["ALL_ATTEMPTS", "LATEST_ATTEMPT", "MemoryStore", "SqliteStore", "Store", "StoreClient"]


def __getattr__(name: str) -> object:
    # The SQLite store and the HTTP client pull in more modules; load them on first use.
    if name == "SqliteStore":
        from alight.store.sqlite import SqliteStore

        return SqliteStore
    if name == "StoreClient":
        from alight.store.client import StoreClient

        return StoreClient
    raise AttributeError(f"module 'alight.store' has no attribute {name!r}")
