"""Fixtures for the proxy tests: the real tiny model behind a real proxy with a real store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.types import Rollout, Span, Task

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"


@pytest.fixture(scope="module")
def served(tiny_dir: Path) -> Iterator[ProxyServer]:
    """A proxy in front of the embedded tiny engine, writing to a MemoryStore (weights never change)."""
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=16, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore())) as server:
        yield server


def new_attempt(server: ProxyServer) -> tuple[str, str]:
    """Enqueue and claim a rollout in the proxy's store (on the proxy's loop); its (rollout, attempt) ids."""
    assert server.proxy.store is not None
    store = server.proxy.store

    async def claim() -> tuple[str, str]:
        [rollout] = await store.enqueue([Rollout(task=Task(input="x"))])
        got = await store.dequeue("test")
        assert got is not None and got.rollout.rollout_id == rollout.rollout_id
        return rollout.rollout_id, got.attempt.attempt_id

    return server.run(claim())


def spans_of(server: ProxyServer, rollout_id: str) -> list[Span]:
    """The rollout's spans once every answered call's span is stored."""
    assert server.proxy.store is not None
    server.flush()
    return server.run(server.proxy.store.query_spans(rollout_id))


async def claim_at(url: str) -> tuple[str, str]:
    """Enqueue and claim a rollout in the store server at `url`; its (rollout, attempt) ids."""
    async with StoreClient(url) as store:
        [rollout] = await store.enqueue([Rollout(task=Task(input="x"))])
        claim = await store.dequeue("test")
        assert claim is not None
        return rollout.rollout_id, claim.attempt.attempt_id


async def spans_at(url: str, rollout_id: str) -> list[Span]:
    """The rollout's spans in the store server at `url`."""
    async with StoreClient(url) as store:
        return await store.query_spans(rollout_id)
