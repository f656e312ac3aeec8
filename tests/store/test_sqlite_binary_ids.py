"""Token ids and log-probs of LLM spans in binary columns: exact round trips, the lean array read,
and version 1 files (ids in JSON) migrated in place."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from alight import semconv
from alight.store.sqlite import SqliteStore
from alight.store.sqlite_schema import SCHEMA_VERSION
from alight.types import Rollout, Span, SpanKind, Task

pytestmark = pytest.mark.anyio

P, R, L = semconv.LLM_PROMPT_TOKEN_IDS, semconv.LLM_RESPONSE_TOKEN_IDS, semconv.LLM_RESPONSE_LOGPROBS


async def _claimed(store: SqliteStore) -> tuple[str, str]:
    rollout = Rollout(task=Task(input=1))
    await store.enqueue([rollout])
    claim = await store.dequeue("w")
    assert claim is not None
    return rollout.rollout_id, claim.attempt.attempt_id


def _llm(rid: str, aid: str, seq: int, attributes: dict[str, Any], kind: SpanKind = SpanKind.LLM) -> Span:
    return Span(rollout_id=rid, attempt_id=aid, sequence_id=seq, name="llm.chat", kind=kind, attributes=attributes)


ODD_VALUES = [
    {P: [1, 2, 3], R: [4, 5], L: [-0.25, -1e-300]},  # the common case: all three in binary
    {P: [1, True], R: [2], L: [-0.5]},  # a bool would read back as 1: stays JSON
    {P: [1, 2**40], R: [3], L: [-0.5]},  # beyond int32: stays JSON
    {P: [1, 2.0], R: [3], L: [-1]},  # a float among ids, an int among log-probs: stay JSON
    {P: [1], R: [2], L: [float("nan")]},  # JSON turns NaN into null: stays JSON
    {P: [], R: [], L: []},  # empty lists
    {P: [7], R: [8]},  # no log-probs
    {P: "not ids", R: None, L: {"a": 1}},  # not lists at all
    {P: [1], R: [2], L: [-0.5], semconv.AGENT_NAME: 5},  # an agent name a column cannot hold: all JSON
    {P: [1], R: [2], L: [-0.5], semconv.AGENT_NAME: "writer", "other": [1, 2]},
]


async def test_every_span_reads_back_as_a_json_round_trip_of_it(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "store.db") as store:
        rid, aid = await _claimed(store)
        spans = [_llm(rid, aid, i + 1, attrs) for i, attrs in enumerate(ODD_VALUES)]
        spans.append(_llm(rid, aid, 99, {P: [1], R: [2], L: [-0.5]}, kind=SpanKind.TOOL))  # not an LLM span
        await store.add_spans(spans)
        got = await store.query_spans(rid)
        assert got == [Span.model_validate_json(s.model_dump_json()) for s in spans]
        for span, back in zip(spans, got, strict=True):  # same types too (True is not 1, 1.0 is not 1)
            for key, value in span.model_dump(mode="json")["attributes"].items():
                assert back.model_dump(mode="json")["attributes"][key] == value
                assert repr(back.attributes[key]) == repr(
                    Span.model_validate_json(span.model_dump_json()).attributes[key]
                )
        dicts = (await store.span_dicts([rid]))[rid]
        assert [Span.model_validate(d) for d in dicts] == got


async def test_ids_are_stored_in_binary_and_not_in_the_json(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "store.db") as store:
        rid, aid = await _claimed(store)
        await store.add_spans([_llm(rid, aid, 1, ODD_VALUES[0]), _llm(rid, aid, 2, ODD_VALUES[1])])
    with sqlite3.connect(tmp_path / "store.db") as raw:
        rows = raw.execute("SELECT data, prompt_ids, response_ids, response_logprobs FROM spans ORDER BY sequence_id")
        (data, prompt, response, logprobs), (odd_data, *odd_blobs) = rows.fetchall()
    assert P not in data and L not in data
    assert np.frombuffer(prompt, "<i4").tolist() == [1, 2, 3] and len(response) == 8 and len(logprobs) == 16
    assert P in odd_data and odd_blobs[0] is None and odd_blobs[1] is not None  # each attribute on its own


async def test_arrays_read_gives_lean_llm_spans_with_numpy_ids(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "store.db") as store:
        rid, aid = await _claimed(store)
        parent = Span(rollout_id=rid, attempt_id=aid, sequence_id=1, name="writer", kind=SpanKind.AGENT)
        lean = _llm(rid, aid, 2, {**ODD_VALUES[0], semconv.AGENT_NAME: "writer"})
        lean.parent_id = parent.span_id
        partial = _llm(rid, aid, 3, ODD_VALUES[6])  # no log-probs: a complete dict, ids as arrays
        reward = Span(rollout_id=rid, attempt_id=aid, sequence_id=4, name="reward", kind=SpanKind.REWARD)
        reward.attributes = {semconv.REWARD_VALUE: 1.0}
        await store.add_spans([parent, lean, partial, reward])
        plain = (await store.span_dicts([rid]))[rid]
        got = (await store.span_dicts([rid], arrays=True))[rid]
    assert [d["span_id"] for d in got] == [d["span_id"] for d in plain]
    assert got[0] == plain[0] and got[3] == plain[3]
    attrs = got[1]["attributes"]
    assert set(attrs) == {P, R, L, semconv.AGENT_NAME}
    assert attrs[P].dtype == np.int32 and attrs[L].dtype == np.float64
    assert attrs[P].tolist() == [1, 2, 3] and attrs[R].tolist() == [4, 5] and attrs[L].tolist() == [-0.25, -1e-300]
    expected = {k: plain[1][k] for k in ("rollout_id", "attempt_id", "sequence_id", "span_id", "parent_id", "kind")}
    assert {k: got[1][k] for k in expected} == expected and got[1]["start_time"] == plain[1]["start_time"]
    assert got[2]["attributes"][P].tolist() == [7] and got[2]["name"] == "llm.chat"
    assert not math.isnan(got[2]["start_time"])


def _write_version_1_file(path: Path, rid: str, aid: str, span: Span) -> None:
    """A store file as the version 1 schema wrote it: ids in the span JSON, no binary columns."""
    rollout = Rollout(rollout_id=rid, task=Task(input=1))
    with sqlite3.connect(path) as raw:
        raw.executescript(
            """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE rollouts (seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL UNIQUE,
                status TEXT NOT NULL, mode TEXT NOT NULL, group_id TEXT, data TEXT NOT NULL);
            CREATE TABLE attempts (attempt_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, number INTEGER NOT NULL,
                status TEXT NOT NULL, data TEXT NOT NULL);
            CREATE TABLE spans (attempt_id TEXT NOT NULL, span_id TEXT NOT NULL, rollout_id TEXT NOT NULL,
                sequence_id INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (attempt_id, span_id));
            CREATE TABLE resources (version INTEGER PRIMARY KEY, data TEXT NOT NULL);
            INSERT INTO meta VALUES ('schema_version', '1');
            """
        )
        raw.execute(
            "INSERT INTO rollouts (rollout_id, status, mode, data) VALUES (?, 'running', 'train', ?)",
            (rid, rollout.model_dump_json()),
        )
        attempt = (
            f'{{"attempt_id": "{aid}", "rollout_id": "{rid}", "number": 1, "status": "running", "claimed_at": 1.0,'
            ' "last_heartbeat_at": 1.0}'
        )
        raw.execute("INSERT INTO attempts VALUES (?, ?, 1, 'running', ?)", (aid, rid, attempt))
        raw.execute("INSERT INTO spans VALUES (?, ?, ?, 1, ?)", (aid, span.span_id, rid, span.model_dump_json()))


async def test_a_version_1_file_is_migrated_in_place_and_reads_as_before(tmp_path: Path) -> None:
    path, rid, aid = tmp_path / "old.db", "ro-old", "at-old"
    old = _llm(rid, aid, 1, {**ODD_VALUES[0], semconv.AGENT_NAME: "writer"})
    _write_version_1_file(path, rid, aid, old)
    async with SqliteStore(path) as store:
        new = _llm(rid, aid, 2, ODD_VALUES[0])
        await store.add_spans([new])
        assert await store.query_spans(rid) == [old, new]
        plain = (await store.span_dicts([rid]))[rid]
        assert [Span.model_validate(d) for d in plain] == [old, new]
        arrays = (await store.span_dicts([rid], arrays=True))[rid]
        assert arrays[0]["attributes"][P] == [1, 2, 3]  # an old row: its ids come from its JSON
        assert arrays[1]["attributes"][P].tolist() == [1, 2, 3]
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        columns = {r[1] for r in raw.execute("PRAGMA table_info(spans)")}
    assert {"prompt_ids", "response_ids", "response_logprobs", "kind", "agent"} <= columns
    async with SqliteStore(path) as store:  # opening it again: nothing left to migrate
        assert await store.query_spans(rid) == [old, new]
