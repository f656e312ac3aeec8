"""`SqliteStore.llm_columns`: many rollouts' LLM calls as flat numpy arrays straight from the binary columns.

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

import numpy as np
import orjson

from alight.store.columns import ID_DTYPE, LOGPROB_DTYPE, Ints, LLMColumns, gc_paused, unread_kinds
from alight.store.sqlite_bulk import _ids_json, check_rollouts_exist

_ARROWS = sqlite3.sqlite_version_info >= (3, 38)
_LEAN = "prompt_ids IS NOT NULL AND response_ids IS NOT NULL AND response_logprobs IS NOT NULL"
# A span's kind without parsing its JSON: pydantic writes Span's fields in order and every field
# before `kind` is a scalar, so the first `"kind":"` is the span's own (a quote inside a JSON string
# is escaped). tests/store/test_sqlite_columns.py holds this assumption to account.
_KIND_AT = 'instr(data, \'"kind":"\') + 8'
_KIND = f"substr(data, {_KIND_AT}, instr(substr(data, {_KIND_AT}, 16), '\"') - 1)"


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
        _read_spans(db, wanted, np.array(claimed, dtype=np.int64), out, tuple(sorted(unread_kinds(tool_spans))))
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
