from __future__ import annotations

from collections.abc import Iterator

import pytest

from alight.store import MemoryStore
from alight.tracing import Tracer, make_tracer
from alight.types import Claim, Rollout, Task


async def new_claim(store: MemoryStore, task_input: object = None) -> Claim:
    """A rollout enqueued, claimed and started: what a runner holds while the agent runs."""
    await store.enqueue([Rollout(task=Task(input=task_input if task_input is not None else {"question": "1+2?"}))])
    claim = await store.dequeue("test-worker")
    assert claim is not None
    await store.start_attempt(claim.attempt.attempt_id)
    return claim


@pytest.fixture(params=["light", "otel"])
def tracer(request: pytest.FixtureRequest) -> Iterator[Tracer]:
    tracer = make_tracer(request.param)
    tracer.instrument()
    yield tracer
