"""`Store.llm_columns`, the trainer's columnar read, from every store: SQLite's own read from its binary
columns, the generic one built from spans (memory), and the HTTP client's binary body; the span-kind
shortcut SQLite's read relies on; the body's encoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from alight import semconv
from alight.errors import NotFoundError, StoreError
from alight.store import Store
from alight.store.columns import ID_ATTRIBUTES, ID_DTYPE, LOGPROB_DTYPE, LLMColumns, decode_columns, encode_columns
from alight.types import Rollout, Span, SpanKind, Task
from tests.adapters.factory import fill_store


def test_the_first_kind_key_in_a_spans_json_is_its_own_kind() -> None:
    """The read finds a span's kind without parsing its JSON: the first `"kind":"` is the span's."""
    tricky = {"nested": {"kind": "agent"}, "text": '"kind":"agent"', semconv.AGENT_NAME: "x"}
    for kind in SpanKind:
        span = Span(rollout_id="ro-1", attempt_id="at-1", name='"kind":"agent"', kind=kind, attributes=tricky)
        data = span.model_dump_json()
        start = data.index('"kind":"') + len('"kind":"')
        assert data[start : data.index('"', start)] == kind.value


@pytest.mark.anyio
async def test_llm_columns_reads_the_latest_attempts_calls_in_rollout_order(store: Store) -> None:
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


def _comparable(cols: LLMColumns) -> dict[str, Any]:
    """Every field, arrays as (dtype kind, values); other spans without the id attributes (which a
    store may leave out of them)."""
    out: dict[str, Any] = {}
    for name in LLMColumns.__slots__:
        value = getattr(cols, name)
        if isinstance(value, np.ndarray):
            out[name] = (value.dtype.kind, value.dtype.itemsize, value.tolist())
        elif name == "other_spans":
            out[name] = [
                (i, {**span, "attributes": {k: v for k, v in span["attributes"].items() if k not in ID_ATTRIBUTES}})
                for i, span in value
            ]
        else:
            out[name] = list(value)
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("tool_spans", [False, True])
async def test_every_store_reads_the_columns_the_generic_read_builds(store: Store, tool_spans: bool) -> None:
    """The store's own read (SQLite's binary columns, the HTTP body) gives what the protocol's generic
    read builds from the same store's spans: lean calls, other spans, unclaimed rollouts, repeats."""
    ids = await fill_store(store, seed=11, n=60)
    asked = [*ids[5:], *ids[:5], ids[7]]
    own = await store.llm_columns(asked, tool_spans=tool_spans)
    generic = await Store.llm_columns(store, asked, tool_spans=tool_spans)
    assert _comparable(own) == _comparable(generic)
    assert own.rollout_ids == list(dict.fromkeys(asked))
    assert len(own.span_ids) > 100 and own.other_spans  # both parts are exercised
    assert {s["kind"] for _, s in own.other_spans} >= ({"reward", "llm", "tool"} if tool_spans else {"reward", "llm"})


def test_columns_body_round_trip() -> None:
    cols = LLMColumns(
        rollout_ids=["ro-1", "ro-2"],
        attempt_ids=["at-1", None],
        group_ids=["g", None],
        rewards=[0.5, None],
        rollout_index=np.array([0, 0], dtype=np.int64),
        sequence_ids=np.array([1, 3], dtype=np.int64),
        span_ids=["s1", "s3"],
        agents=["writer", None],
        parent_ids=[None, "s0"],
        prompt_ids=np.array([1, 2, 3, 2**31 - 1], dtype=ID_DTYPE),
        response_ids=np.array([4, 5, -7], dtype=ID_DTYPE),
        logprobs=np.array([-0.1, -1e-300, 0.0], dtype=LOGPROB_DTYPE),
        prompt_lengths=np.array([3, 1], dtype=np.int64),
        response_lengths=np.array([2, 1], dtype=np.int64),
        logprob_lengths=np.array([2, 1], dtype=np.int64),
        other_spans=[(0, {"kind": "reward", "sequence_id": 2, "attributes": {"reward.value": 1.0}, "name": "é\x00"})],
        other_index=np.array([0], dtype=np.int64),
        other_sequence_ids=np.array([2], dtype=np.int64),
    )
    body = encode_columns(cols)
    assert _comparable(decode_columns(body)) == _comparable(cols)
    assert _comparable(decode_columns(encode_columns(LLMColumns()))) == _comparable(LLMColumns())
    for bad in (b"", b"XXXX\x00\x00\x00\x00", body[:40], body[:-4]):
        with pytest.raises(StoreError, match="bad columns body"):
            decode_columns(bad)
