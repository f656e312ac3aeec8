"""The bulk reads of the Store protocol (`span_dicts`, `rollout_dicts`) return what `query_spans` and
`get_rollout` return, as dicts, from every store (memory, SQLite, HTTP client over both)."""

from __future__ import annotations

import pytest

from alight import semconv
from alight.errors import NotFoundError
from alight.store import Store
from alight.types import AttemptStatus, Rollout, Span, SpanKind, Task

pytestmark = pytest.mark.anyio


async def _attempt_with_spans(store: Store, rollout_id: str, tag: str) -> None:
    claim = await store.dequeue("w")
    assert claim is not None and claim.rollout.rollout_id == rollout_id
    aid = claim.attempt.attempt_id

    def span(name: str, seq: int | None, kind: SpanKind = SpanKind.LLM, start: float = 0.0) -> Span:
        attrs = {semconv.AGENT_NAME: tag, semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3]}
        return Span(rollout_id=rollout_id, attempt_id=aid, name=name, kind=kind, attributes=attrs, start_time=start)

    # Explicit sequence ids written out of order, a tie, then spans the store numbers itself.
    await store.add_spans([span("c", 5), span("a", 1), span("b", 3), span("b2", 3, start=1.0)])
    await store.add_spans([span("d", None, SpanKind.REWARD), span("e", None, SpanKind.TOOL)])
    await store.add_spans([span("a", 1)])  # a duplicate span id would be new: same name is not the same span


async def _populate(store: Store) -> list[str]:
    rollouts = [Rollout(task=Task(input=i), max_attempts=2, group_id=f"g{i // 2}") for i in range(5)]
    await store.enqueue(rollouts)
    ids = [r.rollout_id for r in rollouts]
    for i, rid in enumerate(ids[:4]):  # the last rollout is never claimed
        await _attempt_with_spans(store, rid, f"first{i}")
        claim_aid = (await store.list_attempts(rid))[-1].attempt_id
        if i % 2 == 0:  # even rollouts fail once and run a second attempt
            await store.finish_attempt(claim_aid, AttemptStatus.FAILED, error="boom")
            await _attempt_with_spans(store, rid, f"second{i}")
            claim_aid = (await store.list_attempts(rid))[-1].attempt_id
        await store.finish_attempt(claim_aid, AttemptStatus.SUCCEEDED, reward=float(i))
    return ids


@pytest.mark.parametrize("all_attempts", [False, True])
async def test_same_spans_in_same_order_as_query_spans(store: Store, all_attempts: bool) -> None:
    ids = await _populate(store)
    asked = [ids[3], ids[0], ids[4], ids[1], ids[2], ids[0]]  # any order, a repeat
    got = await store.span_dicts(asked, all_attempts=all_attempts)
    assert list(got) == [ids[3], ids[0], ids[4], ids[1], ids[2]]
    for rid in ids:
        expected = await store.query_spans(rid, "all" if all_attempts else "latest")
        assert [Span.model_validate(d) for d in got[rid]] == expected
        assert all(isinstance(d["sequence_id"], int) for d in got[rid])  # from the column, never None
    assert got[ids[4]] == []
    assert len(got[ids[0]]) == (14 if all_attempts else 7)


async def test_unknown_rollout_and_empty_request(store: Store) -> None:
    ids = await _populate(store)
    assert await store.span_dicts([]) == {}
    with pytest.raises(NotFoundError, match="ro-nope"):
        await store.span_dicts([ids[0], "ro-nope"])


async def test_rollout_dicts_match_get_rollout(store: Store) -> None:
    ids = await _populate(store)
    got = await store.rollout_dicts([ids[2], ids[0], ids[4], ids[2]])
    assert [Rollout.model_validate(d) for d in got] == [await store.get_rollout(i) for i in (ids[2], ids[0], ids[4])]
    assert got[0]["reward"] == 2.0 and got[0]["group_id"] == "g1"
    with pytest.raises(NotFoundError, match="ro-nope"):
        await store.rollout_dicts(["ro-nope", ids[0]])
