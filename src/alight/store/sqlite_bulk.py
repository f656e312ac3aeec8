"""The trainer's bulk reads of a SQLite store: many rollouts' spans and records in a few queries.

No pydantic: spans and rollouts come back as plain dicts in their JSON shape. With `arrays=True`,
an LLM span whose token ids are stored in binary (`alight.store.sqlite_schema`) is built from its
columns without parsing its JSON, its ids and log-probs as numpy arrays read straight from the
stored bytes: what the adapter needs, at a fraction of the cost of Python lists.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from alight.errors import NotFoundError
from alight.semconv import AGENT_NAME
from alight.store.columns import ID_ATTRIBUTES, ID_DTYPE, LOGPROB_DTYPE, gc_paused
from alight.store.sqlite_schema import restore_attributes

_DTYPES: tuple[np.dtype[Any], ...] = (ID_DTYPE, ID_DTYPE, LOGPROB_DTYPE)

_LEAN = "prompt_ids IS NOT NULL AND response_ids IS NOT NULL AND response_logprobs IS NOT NULL"


def _ids_json(ids: Sequence[str]) -> str:
    return orjson.dumps(list(ids)).decode()


def check_rollouts_exist(db: sqlite3.Connection, rollout_ids: Sequence[str]) -> None:
    """NotFoundError naming the first of `rollout_ids` the store does not hold."""
    known = {
        r[0]
        for r in db.execute(
            "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
            (_ids_json(rollout_ids),),
        )
    }
    missing = [i for i in rollout_ids if i not in known]
    if missing:
        raise NotFoundError(f"unknown rollout {missing[0]!r}")


def span_dicts(
    db: sqlite3.Connection, rollout_ids: Sequence[str], *, all_attempts: bool = False, arrays: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """See `SqliteStore.span_dicts`."""
    ids = list(dict.fromkeys(rollout_ids))
    if not ids:
        return {}
    attempts = db.execute(
        "SELECT rollout_id, attempt_id FROM attempts WHERE rollout_id IN (SELECT value FROM json_each(?))"
        " ORDER BY rollout_id, number",
        (_ids_json(ids),),
    ).fetchall()
    chosen: dict[str, list[str]] = {}
    for rollout_id, attempt_id in attempts:
        chosen.setdefault(rollout_id, []).append(attempt_id)
    if len(chosen) < len(ids):
        check_rollouts_exist(db, [i for i in ids if i not in chosen])
    if not all_attempts:
        chosen = {rid: aids[-1:] for rid, aids in chosen.items()}
    by_attempt: dict[str, list[dict[str, Any]]] = {aid: [] for aids in chosen.values() for aid in aids}
    wanted = (_ids_json(list(by_attempt)),)
    with gc_paused():
        if arrays:
            rollout_of = {aid: rid for rid, aids in chosen.items() for aid in aids}
            _read_arrays(db, wanted, by_attempt, rollout_of)
        else:
            _read_lists(db, wanted, by_attempt)
    out: dict[str, list[dict[str, Any]]] = {}
    for rollout_id in ids:
        aids = chosen.get(rollout_id, ())
        out[rollout_id] = by_attempt[aids[0]] if len(aids) == 1 else [s for a in aids for s in by_attempt[a]]
    return out


def _read_lists(db: sqlite3.Connection, wanted: tuple[str], by_attempt: dict[str, list[dict[str, Any]]]) -> None:
    rows = db.execute(
        "SELECT attempt_id, sequence_id, data, prompt_ids, response_ids, response_logprobs FROM spans"
        " WHERE attempt_id IN (SELECT value FROM json_each(?)) ORDER BY attempt_id, sequence_id",
        wanted,
    )
    loads = orjson.loads
    for attempt_id, seq, data, *blobs in rows:
        span = loads(data)
        span["sequence_id"] = seq
        if blobs != [None, None, None]:
            restore_attributes(span["attributes"], tuple(blobs))
        by_attempt[attempt_id].append(span)


def _read_arrays(
    db: sqlite3.Connection,
    wanted: tuple[str],
    by_attempt: dict[str, list[dict[str, Any]]],
    rollout_of: dict[str, str],
) -> None:
    # Only the columns a lean LLM span needs: every column read costs about 0.1 us a row.
    rows = db.execute(
        "SELECT attempt_id, sequence_id, span_id, parent_id, kind, start_time, agent,"
        f" prompt_ids, response_ids, response_logprobs, CASE WHEN {_LEAN} THEN NULL ELSE data END FROM spans"
        " WHERE attempt_id IN (SELECT value FROM json_each(?)) ORDER BY attempt_id, sequence_id",
        wanted,
    )
    loads, frombuffer = orjson.loads, np.frombuffer
    prompt_key, response_key, logprobs_key = ID_ATTRIBUTES
    for attempt_id, seq, span_id, parent_id, kind, start, agent, prompt, response, lp, data in rows:
        if data is None:  # an LLM span with every id in binary: no JSON to parse
            attributes = {
                prompt_key: frombuffer(prompt, ID_DTYPE),
                response_key: frombuffer(response, ID_DTYPE),
                logprobs_key: frombuffer(lp, LOGPROB_DTYPE),
            }
            if agent is not None:
                attributes[AGENT_NAME] = agent
            span = {
                "rollout_id": rollout_of[attempt_id],
                "attempt_id": attempt_id,
                "sequence_id": seq,
                "span_id": span_id,
                "parent_id": parent_id,
                "kind": kind,
                "attributes": attributes,
                "start_time": start,
            }
        else:
            span = loads(data)
            span["sequence_id"] = seq
            if prompt is not None or response is not None or lp is not None:
                held = span["attributes"]
                for key, dtype, blob in zip(ID_ATTRIBUTES, _DTYPES, (prompt, response, lp), strict=True):
                    if blob is not None:
                        held[key] = frombuffer(blob, dtype)
        by_attempt[attempt_id].append(span)


def rollout_dicts(db: sqlite3.Connection, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
    """See `SqliteStore.rollout_dicts`."""
    ids = list(dict.fromkeys(rollout_ids))
    rows = db.execute(
        "SELECT rollout_id, data FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
        (_ids_json(ids),),
    )
    found = {rollout_id: data for rollout_id, data in rows}
    if len(found) < len(ids):
        check_rollouts_exist(db, ids)
    loads = orjson.loads
    with gc_paused():
        return [loads(found[rollout_id]) for rollout_id in ids]
