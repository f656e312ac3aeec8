"""The columnar fast path (`LightningRL.batch_from_store`) gives exactly the batch and counts of the
object path (`rollout_dicts` + `span_dicts(arrays=True)` + `adapt_rollouts` + `batch`) over rollouts
stored in a real SqliteStore: agents matched or not, truncation, every built-in credit mode, groups
of different sizes, empty rollouts, and rollouts the fast path hands to the object path."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alight.adapters import AdapterStats
from alight.algorithms import LightningRL, TransitionBatch
from alight.algorithms.columnar import fast_rollouts
from alight.config import AdapterConfig, AlgorithmConfig
from alight.store import MemoryStore, Store
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from tests.adapters.factory import fill_store as _fill


async def _object_path(
    rl: LightningRL, store: Store, ids: list[str], pad_id: int = -1
) -> tuple[TransitionBatch | None, AdapterStats]:
    rollouts, spans = await store.rollout_dicts(ids), await store.span_dicts(ids, arrays=True)
    transitions, stats = rl.adapt_rollouts(rollouts, spans)
    return (rl.batch(transitions, pad_id) if transitions else None), stats


def _assert_same(fast: TransitionBatch | None, slow: TransitionBatch | None) -> None:
    assert (fast is None) == (slow is None)
    if fast is None or slow is None:
        return
    expected = slow.tensors()
    for name, tensor in fast.tensors().items():
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(tensor, expected[name]), name
    assert fast.meta == slow.meta
    assert fast.pad_id == slow.pad_id


def _rl(**adapter: Any) -> LightningRL:
    estimator = adapter.pop("advantage", "grpo")
    return LightningRL.from_config(AdapterConfig(**adapter), AlgorithmConfig(advantage=estimator))


CONFIGS = [
    {},
    {"agent_match": "writer|checker"},
    {"agent_match": "critic", "credit": "last"},
    {"credit": "discounted", "gamma": 0.9},
    {"credit": "discounted", "gamma": 0.9, "advantage": "rloo", "agent_match": "writer"},
    {"max_prompt_length": 5, "max_response_length": 3},
    {"max_prompt_length": 4, "credit": "last", "advantage": "reinforce_pp"},
    {"air": [{"match": {"name": "run_sql"}, "on_error": -0.2}]},
    {"mode": "trajectory"},
]


#: Every store answers the bulk reads: SQLite from its binary columns, memory through the protocol's
#: generic columns, and a store server's client in one binary body.
KINDS = ["sqlite", "memory", "http+sqlite", "http+memory"]
OpenStore = Callable[[], contextlib.AbstractAsyncContextManager[Store]]
Stored = tuple[OpenStore, list[str]]


@pytest.fixture(scope="module", params=KINDS)
def stored(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OpenStore, list[str]]]:
    """A store of each kind filled once for the module, and how a test opens it on its own event loop."""
    import asyncio

    kind: str = request.param
    path = tmp_path_factory.mktemp("columnar") / "store.db"
    backing: Store = MemoryStore() if kind.endswith("memory") else SqliteStore(path)

    @contextlib.asynccontextmanager
    async def backing_store() -> AsyncIterator[Store]:
        yield backing  # closed at the end of the module

    async def fill(opened: OpenStore) -> list[str]:
        async with opened() as store:
            return await _fill(store, seed=7, n=120)

    if not kind.startswith("http+"):
        ids = asyncio.run(fill(backing_store))
        yield backing_store, ids
        asyncio.run(backing.close())
        return
    with StoreServer(backing, watchdog_interval_s=None) as server:

        def client() -> contextlib.AbstractAsyncContextManager[Store]:
            return StoreClient(server.url)

        yield client, asyncio.run(fill(client))


@pytest.mark.anyio
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
async def test_fast_path_gives_the_object_paths_batch(stored: Stored, config: dict[str, Any]) -> None:
    opened, ids = stored
    rl = _rl(**dict(config))
    async with opened() as store:
        fast_batch, fast_stats = await rl.batch_from_store(store, ids, pad_id=-1)
        slow_batch, slow_stats = await _object_path(rl, store, ids)
        # Both sides of the split are exercised: most rollouts fast, some handed to the object path.
        fast, _ = fast_rollouts(rl.adapter, await store.llm_columns(ids))
    assert fast_stats == slow_stats
    _assert_same(fast_batch, slow_batch)
    assert 0 < fast.sum() < len(ids)


@pytest.mark.anyio
async def test_steps_of_one_group_and_no_rollouts(stored: Stored) -> None:
    opened, ids = stored
    rl = _rl()
    async with opened() as store:
        for step in (ids[:1], ids[3:9], [ids[5], ids[5], ids[2]], []):
            fast_batch, fast_stats = await rl.batch_from_store(store, step, pad_id=-1)
            slow_batch, slow_stats = await _object_path(rl, store, list(dict.fromkeys(step)))
            assert fast_stats == slow_stats
            _assert_same(fast_batch, slow_batch)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    config=st.sampled_from(CONFIGS[:-1]),
    step=st.integers(1, 40),
)
def test_fast_path_matches_on_random_stores(tmp_path: Path, seed: int, config: dict[str, Any], step: int) -> None:
    import asyncio

    rl = _rl(**dict(config))

    async def check() -> None:
        async with SqliteStore(tmp_path / f"store-{uuid.uuid4().hex}.db") as store:  # a new store per example
            ids = await _fill(store, seed=seed, n=step)
            fast_batch, fast_stats = await rl.batch_from_store(store, ids, pad_id=0)
            slow_batch, slow_stats = await _object_path(rl, store, ids, 0 if step else -1)
            assert fast_stats == slow_stats
            _assert_same(fast_batch, slow_batch)

    asyncio.run(check())


@pytest.mark.anyio
async def test_every_store_gives_sqlites_batch(stored: Stored, tmp_path: Path) -> None:
    """The same rollouts (made from the same seed, under other ids) give the same tensors and counts
    from every store as from SQLite's own columns."""
    opened, ids = stored
    rl = _rl(max_prompt_length=6)
    async with opened() as store:
        batch, stats = await rl.batch_from_store(store, ids, pad_id=-1)
    async with SqliteStore(tmp_path / "s.db") as sqlite:
        expected_batch, expected_stats = await rl.batch_from_store(
            sqlite, await _fill(sqlite, seed=7, n=120), pad_id=-1
        )
    assert stats == expected_stats
    assert batch is not None and expected_batch is not None
    for name, tensor in batch.tensors().items():
        assert torch.equal(tensor, expected_batch.tensors()[name]), name
    assert batch.meta["step_index"] == expected_batch.meta["step_index"]
    assert batch.meta["agent_name"] == expected_batch.meta["agent_name"]
