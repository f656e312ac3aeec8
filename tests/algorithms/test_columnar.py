"""The columnar fast path (`LightningRL.batch_from_store`) gives exactly the batch and counts of the
object path (`rollout_dicts` + `span_dicts(arrays=True)` + `adapt_rollouts` + `batch`) over rollouts
stored in a real SqliteStore: agents matched or not, truncation, every built-in credit mode, groups
of different sizes, empty rollouts, and rollouts the fast path hands to the object path."""

from __future__ import annotations

import random
import uuid
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
from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, Rollout, Task
from tests.adapters.factory import Trace

AGENTS = ("writer", "checker", "critic", None)
#: What a rollout may hold that the fast path leaves to the object path.
SLOW = ("client_call", "no_logprobs", "mid_reward", "parent_agent", "same_seq", "empty_response")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000) for _ in range(n)]


def _trace(rng: random.Random, rollout_id: str, attempt_id: str, slow: str | None) -> Trace:
    t = Trace(rollout_id, attempt_id)
    root = t.agent("root")
    for _ in range(rng.randint(0, 5)):
        agent = rng.choice(AGENTS)
        t.llm(_ids(rng, rng.randint(1, 12)), _ids(rng, rng.randint(1, 7)), agent=agent)
        if rng.random() < 0.3:
            t.tool("run_sql", error=rng.random() < 0.5, sql="SELECT 1")
    if slow == "client_call":
        t.llm(None, None, messages=[{"role": "user", "content": "hi"}])
    elif slow == "no_logprobs":
        t.llm([1, 2], [3], logprobs=None)
    elif slow == "mid_reward":
        t.reward(0.5)
        t.llm([4, 5, 6], [7, 8])
    elif slow == "parent_agent":
        t.llm([1, 2, 3], [4], agent=None, parent_id=root.span_id)
    elif slow == "same_seq":
        t.llm([1, 2, 3], [4, 5], sequence_id=t._seq)
    elif slow == "empty_response":
        t.llm([1, 2], [])
    roll = rng.random()
    if roll < 0.5:
        t.reward(rng.choice([0.0, 1.0, 0.25]), "final")
    elif roll < 0.7:
        t.reward(rng.choice([0.0, 1.0, -0.5]))  # the episode's own reward, not named "final"
    return t


async def _fill(store: SqliteStore, seed: int, n: int) -> list[str]:
    """`n` rollouts in groups of 1 to 4 (some without a group), each finished or never claimed."""
    rng = random.Random(seed)
    ids: list[str] = []
    group, unclaimed = 0, []
    while len(ids) < n:
        size, group = rng.randint(1, 4), group + 1
        for _ in range(size):
            rollout = Rollout(task=Task(input={"q": group}), group_id=None if rng.random() < 0.1 else f"g{group}")
            ids.append(rollout.rollout_id)
            if rng.random() < 0.05:
                unclaimed.append(rollout)  # never claimed: no attempt, no spans
                continue
            await store.enqueue([rollout])
            claim = await store.dequeue("w0")
            assert claim is not None and claim.rollout.rollout_id == rollout.rollout_id
            slow = rng.choice(SLOW) if rng.random() < 0.2 else None
            await store.add_spans(_trace(rng, rollout.rollout_id, claim.attempt.attempt_id, slow).spans)
            reward = None if rng.random() < 0.3 else rng.choice([0.0, 1.0, 0.5, 0.1])
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=reward)
    await store.enqueue(unclaimed)
    return ids


async def _object_path(
    rl: LightningRL, store: SqliteStore, ids: list[str], pad_id: int = -1
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


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    import asyncio

    path = tmp_path_factory.mktemp("columnar") / "store.db"

    async def fill() -> list[str]:
        async with SqliteStore(path) as store:
            return await _fill(store, seed=7, n=120)

    return path, asyncio.run(fill())


@pytest.mark.anyio
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
async def test_fast_path_gives_the_object_paths_batch(stored: tuple[Path, list[str]], config: dict[str, Any]) -> None:
    path, ids = stored
    rl = _rl(**dict(config))
    async with SqliteStore(path) as store:
        fast_batch, fast_stats = await rl.batch_from_store(store, ids, pad_id=-1)
        slow_batch, slow_stats = await _object_path(rl, store, ids)
        # Both sides of the split are exercised: most rollouts fast, some handed to the object path.
        fast, _ = fast_rollouts(rl.adapter, await store.llm_columns(ids))
    assert fast_stats == slow_stats
    _assert_same(fast_batch, slow_batch)
    assert 0 < fast.sum() < len(ids)


@pytest.mark.anyio
async def test_steps_of_one_group_and_no_rollouts(stored: tuple[Path, list[str]]) -> None:
    path, ids = stored
    rl = _rl()
    async with SqliteStore(path) as store:
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
async def test_any_store_gives_the_same_batch(tmp_path: Path) -> None:
    """A store without the bulk reads (the memory store) takes the object path: the same rollouts
    (made from the same seed, under other ids) give the same tensors and counts."""
    from alight.store.memory import MemoryStore

    rl = _rl(max_prompt_length=6)
    memory = MemoryStore()
    memory_batch, memory_stats = await rl.batch_from_store(memory, await _fill(memory, seed=3, n=30), pad_id=-1)
    async with SqliteStore(tmp_path / "s.db") as store:
        fast_batch, fast_stats = await rl.batch_from_store(store, await _fill(store, seed=3, n=30), pad_id=-1)
    assert memory_stats == fast_stats
    assert fast_batch is not None and memory_batch is not None
    for name, tensor in fast_batch.tensors().items():
        assert torch.equal(tensor, memory_batch.tensors()[name]), name
    assert fast_batch.meta["step_index"] == memory_batch.meta["step_index"]
    assert fast_batch.meta["agent_name"] == memory_batch.meta["agent_name"]
