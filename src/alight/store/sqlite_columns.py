"""The trainer's columnar read of a SQLite store: many rollouts' LLM calls as flat numpy arrays.

`span_dicts(arrays=True)` still builds a dict and three arrays per span; at tens of thousands of
calls a step that per-span Python work is most of the read. Here the LLM spans whose ids are all
in binary ("lean" rows) come back as columns: one SQL query, one tuple per row, and each binary
column joined once (`b"".join`) and read with one `np.frombuffer`, with per-span lengths. The
other spans (agent, tool, reward spans, LLM spans with ids in the JSON) are few and come back as
parsed dicts, for the caller to judge (`alight.algorithms.columnar`), except the kinds it says it
does not read (agent spans; tool spans unless asked), of which only the position is returned.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from alight.store.sqlite_bulk import ID_DTYPE, LOGPROB_DTYPE, _ids_json, check_rollouts_exist, gc_paused

_ARROWS = sqlite3.sqlite_version_info >= (3, 38)
_LEAN = "prompt_ids IS NOT NULL AND response_ids IS NOT NULL AND response_logprobs IS NOT NULL"
# A span's kind without parsing its JSON: pydantic writes Span's fields in order and every field
# before `kind` is a scalar, so the first `"kind":"` is the span's own (a quote inside a JSON string
# is escaped). tests/store/test_sqlite_columns.py holds this assumption to account.
_KIND_AT = 'instr(data, \'"kind":"\') + 8'
_KIND = f"substr(data, {_KIND_AT}, instr(substr(data, {_KIND_AT}, 16), '\"') - 1)"

Ints = npt.NDArray[np.int64]


def _no_ints() -> Ints:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class LLMColumns:
    """The latest attempt of each rollout, its lean LLM spans as columns and its other spans as dicts.

    Per rollout (the order given, duplicates dropped): `rollout_ids`, `attempt_ids` (None: never
    claimed), `group_ids`, `rewards` (Rollout.reward). Per lean LLM span, rollouts in order, each
    rollout's spans by sequence id: `rollout_index`, `sequence_ids`, `span_ids`, `agents` (the
    agent-name column), `parent_ids`, and flat `prompt_ids`/`response_ids` (int32) and `logprobs`
    (float64) with each span's `prompt_lengths`, `response_lengths`, `logprob_lengths`.
    `other_spans`: (rollout index, span dict in Span's JSON shape, `sequence_id` from its column)
    of every other span but agent spans (and tool spans unless `tool_spans`), in the same order;
    attributes held in binary are left out of these dicts. `other_index`, `other_sequence_ids`:
    their rollout indices and sequence ids.
    """

    rollout_ids: list[str] = field(default_factory=list)
    attempt_ids: list[str | None] = field(default_factory=list)
    group_ids: list[str | None] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    rollout_index: Ints = field(default_factory=_no_ints)
    sequence_ids: Ints = field(default_factory=_no_ints)
    span_ids: Sequence[str] = ()
    agents: Sequence[str | None] = ()
    parent_ids: Sequence[str | None] = ()  # only where `agents` is None
    prompt_ids: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=ID_DTYPE))
    response_ids: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=ID_DTYPE))
    logprobs: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0, dtype=LOGPROB_DTYPE))
    prompt_lengths: Ints = field(default_factory=_no_ints)
    response_lengths: Ints = field(default_factory=_no_ints)
    logprob_lengths: Ints = field(default_factory=_no_ints)
    other_spans: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    other_index: Ints = field(default_factory=_no_ints)
    other_sequence_ids: Ints = field(default_factory=_no_ints)


def llm_columns(db: sqlite3.Connection, rollout_ids: Sequence[str], *, tool_spans: bool = False) -> LLMColumns:
    """See `SqliteStore.llm_columns`."""
    ids = list(dict.fromkeys(rollout_ids))
    out = LLMColumns(rollout_ids=ids)
    if not ids:
        return out
    latest = "(SELECT attempt_id FROM attempts AS a WHERE a.rollout_id = r.rollout_id ORDER BY number DESC LIMIT 1)"
    # `->` (SQLite 3.38+) gives the value's JSON text as stored: parsed as the object path parses it.
    fields = "data ->> '$.group_id', data -> '$.reward'" if _ARROWS else "data"
    rows = db.execute(
        f"SELECT rollout_id, {latest}, {fields} FROM rollouts AS r"
        " WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (_ids_json(ids),),
    )
    found = {row[0]: row for row in rows}
    if len(found) < len(ids):
        check_rollouts_exist(db, ids)
    loads = orjson.loads
    ordered = [found[i] for i in ids]
    out.attempt_ids = [row[1] for row in ordered]
    if _ARROWS:
        out.group_ids = [row[2] for row in ordered]
        out.rewards = [None if row[3] is None else loads(row[3]) for row in ordered]
    else:
        parsed = [loads(row[2]) for row in ordered]
        out.group_ids, out.rewards = [r.get("group_id") for r in parsed], [r.get("reward") for r in parsed]
    claimed = [n for n, attempt_id in enumerate(out.attempt_ids) if attempt_id is not None]
    wanted = (_ids_json([attempt_id for attempt_id in out.attempt_ids if attempt_id is not None]),)
    with gc_paused():
        _read_spans(db, wanted, np.array(claimed, dtype=np.int64), out, ("agent",) if tool_spans else ("agent", "tool"))
    return out


def _read_spans(
    db: sqlite3.Connection, wanted: tuple[str], rollout_of: Ints, out: LLMColumns, unread: tuple[str, ...]
) -> None:
    # One pass: the binary columns follow the large JSON column, so each row's overflow pages are walked
    # once. The plan (json_each outer, the (attempt_id, sequence_id) index inner) yields rows in rollout
    # then sequence order with no sort; checked below, and sorted when a plan ever does otherwise.
    skip = ", ".join("?" * len(unread))
    rows = db.execute(
        "SELECT w.key, sequence_id, span_id, agent, CASE WHEN agent IS NULL THEN parent_id END,"
        f" CASE WHEN {_LEAN} THEN prompt_ids ELSE x'' END, CASE WHEN {_LEAN} THEN response_ids ELSE x'' END,"
        f" CASE WHEN {_LEAN} THEN response_logprobs ELSE x'' END,"
        f" CASE WHEN {_LEAN} THEN NULL ELSE data END"
        " FROM json_each(?) AS w CROSS JOIN spans ON spans.attempt_id = w.value"
        f" WHERE {_LEAN} OR {_KIND} NOT IN ({skip})",
        (*wanted, *unread),
    ).fetchall()
    if not rows:
        return
    n = len(rows)
    keys = np.fromiter([row[0] for row in rows], dtype=np.int64, count=n)
    seqs = np.fromiter([row[1] for row in rows], dtype=np.int64, count=n)
    if n > 1 and ((np.diff(keys) < 0) | ((np.diff(keys) == 0) & (np.diff(seqs) < 0))).any():
        order = np.lexsort((seqs, keys))
        rows = list(map(rows.__getitem__, order.tolist()))
        keys, seqs = keys[order], seqs[order]
    _, _, span_ids, agents, parents, prompts, responses, logprobs, data = zip(*rows, strict=True)
    del rows
    lean = np.fromiter((d is None for d in data), dtype=np.bool_, count=n)  # the JSON is read for all but these
    index = rollout_of[keys]
    # Every row's runs, the other spans' empty: lean rows are picked from them with numpy.
    prompt_lengths = np.fromiter(map(len, prompts), dtype=np.int64, count=n) // ID_DTYPE.itemsize
    response_lengths = np.fromiter(map(len, responses), dtype=np.int64, count=n) // ID_DTYPE.itemsize
    logprob_lengths = np.fromiter(map(len, logprobs), dtype=np.int64, count=n) // LOGPROB_DTYPE.itemsize
    out.prompt_ids = np.frombuffer(b"".join(prompts), ID_DTYPE)
    out.response_ids = np.frombuffer(b"".join(responses), ID_DTYPE)
    out.logprobs = np.frombuffer(b"".join(logprobs), LOGPROB_DTYPE)
    if lean.all():
        out.span_ids, out.agents, out.parent_ids = span_ids, agents, parents
    else:
        loads = orjson.loads
        other = np.flatnonzero(~lean)
        for row, i in zip(other.tolist(), index[other].tolist(), strict=True):
            span = loads(data[row])
            span["sequence_id"] = seqs[row].item()
            out.other_spans.append((i, span))
        out.other_index, out.other_sequence_ids = index[other], seqs[other]
        picked = np.flatnonzero(lean)
        out.span_ids = np.asarray(span_ids, dtype=object)[picked].tolist()
        out.agents = np.asarray(agents, dtype=object)[picked].tolist()
        out.parent_ids = np.asarray(parents, dtype=object)[picked].tolist()
        index, seqs = index[picked], seqs[picked]
        prompt_lengths, response_lengths = prompt_lengths[picked], response_lengths[picked]
        logprob_lengths = logprob_lengths[picked]
    out.rollout_index, out.sequence_ids = index, seqs
    out.prompt_lengths, out.response_lengths, out.logprob_lengths = prompt_lengths, response_lengths, logprob_lengths
