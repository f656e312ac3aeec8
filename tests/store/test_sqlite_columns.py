"""`SqliteStore.llm_columns`: the columnar read of LLM spans, and the span-kind shortcut it relies on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alight import semconv
from alight.errors import NotFoundError
from alight.store.sqlite import SqliteStore
from alight.types import Rollout, Span, SpanKind, Task


def test_the_first_kind_key_in_a_spans_json_is_its_own_kind() -> None:
    """The read finds a span's kind without parsing its JSON: the first `"kind":"` is the span's."""
    tricky = {"nested": {"kind": "agent"}, "text": '"kind":"agent"', semconv.AGENT_NAME: "x"}
    for kind in SpanKind:
        span = Span(rollout_id="ro-1", attempt_id="at-1", name='"kind":"agent"', kind=kind, attributes=tricky)
        data = span.model_dump_json()
        start = data.index('"kind":"') + len('"kind":"')
        assert data[start : data.index('"', start)] == kind.value


@pytest.mark.anyio
async def test_llm_columns_reads_the_latest_attempts_calls_in_rollout_order(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        rollouts = [Rollout(task=Task(input=i), group_id=f"g{i % 2}") for i in range(3)]
        await store.enqueue(rollouts)
        spans = []
        for n, rollout in enumerate(rollouts[:2]):
            claim = await store.dequeue("w")
            assert claim is not None
            for seq in (2, 1):  # written out of order
                attributes = {
                    semconv.AGENT_NAME: f"a{seq}",
                    semconv.LLM_PROMPT_TOKEN_IDS: [n, seq, 7],
                    semconv.LLM_RESPONSE_TOKEN_IDS: [seq],
                    semconv.LLM_RESPONSE_LOGPROBS: [-0.5 * seq],
                }
                spans.append(
                    Span(
                        rollout_id=rollout.rollout_id,
                        attempt_id=claim.attempt.attempt_id,
                        sequence_id=seq,
                        name="llm.chat",
                        kind=SpanKind.LLM,
                        attributes=attributes,
                    )
                )
            spans.append(
                Span(
                    rollout_id=rollout.rollout_id,
                    attempt_id=claim.attempt.attempt_id,
                    sequence_id=3,
                    name="reward",
                    kind=SpanKind.REWARD,
                    attributes={semconv.REWARD_VALUE: 1.0},
                )
            )
        await store.add_spans(spans)
        ids = [r.rollout_id for r in reversed(rollouts)]
        cols = await store.llm_columns(ids)
        with pytest.raises(NotFoundError):
            await store.llm_columns(["ro-missing"])
    assert cols.rollout_ids == ids and cols.group_ids == ["g0", "g1", "g0"] and cols.attempt_ids[0] is None
    assert cols.rollout_index.tolist() == [1, 1, 2, 2] and cols.sequence_ids.tolist() == [1, 2, 1, 2]
    assert list(cols.agents) == ["a1", "a2", "a1", "a2"]
    assert cols.prompt_ids.tolist() == [1, 1, 7, 1, 2, 7, 0, 1, 7, 0, 2, 7]
    assert cols.prompt_lengths.tolist() == [3, 3, 3, 3] and cols.response_ids.tolist() == [1, 2, 1, 2]
    assert np.array_equal(cols.logprobs, [-0.5, -1.0, -0.5, -1.0])
    assert [(i, s["kind"], s["sequence_id"]) for i, s in cols.other_spans] == [(1, "reward", 3), (2, "reward", 3)]
