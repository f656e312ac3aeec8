"""One rollout's spans in a SQLite store: the batch write (checked whole before any of it is
written, sequence ids given in order per attempt) and the read of one attempt's or all attempts'
spans. The trainer's many-rollout reads are `alight.store.sqlite_bulk`'s."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import orjson

from alight.errors import NotFoundError
from alight.store.base import chosen_attempts
from alight.store.sqlite_schema import insert_spans, read_row, restore_attributes, span_row
from alight.types import Span


def add_spans(db: sqlite3.Connection, spans: Sequence[Span]) -> int:
    """Write `spans` inside the caller's write transaction; the number of new rows (a span already
    stored is not written again). NotFoundError, before anything is written, for a span whose
    attempt is unknown or belongs to another rollout."""
    owners = dict(
        db.execute(
            "SELECT attempt_id, rollout_id FROM attempts WHERE attempt_id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(list({s.attempt_id for s in spans})),),
        ).fetchall()
    )
    for span in spans:  # validate the whole batch before writing any of it
        if span.attempt_id not in owners:
            raise NotFoundError(f"unknown attempt {span.attempt_id!r}")
        if owners[span.attempt_id] != span.rollout_id:
            raise NotFoundError(f"attempt {span.attempt_id!r} is not in rollout {span.rollout_id!r}")
    last_seq = {
        aid: db.execute("SELECT MAX(sequence_id) FROM spans WHERE attempt_id = ?", (aid,)).fetchone()[0] or 0
        for aid in owners
    }
    rows = []
    for span in spans:
        # The sequence_id column is authoritative; the JSON keeps what the caller sent.
        seq = span.sequence_id if span.sequence_id is not None else last_seq[span.attempt_id] + 1
        last_seq[span.attempt_id] = max(last_seq[span.attempt_id], seq)
        rows.append(span_row(span, seq))
    before = db.total_changes
    insert_spans(db, rows)
    return db.total_changes - before


def query_spans(db: sqlite3.Connection, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
    """The spans of every attempt (None or "all"), of the last ("latest") or of `attempt_id`, in
    attempt then sequence order. NotFoundError for an unknown rollout or an attempt not in it."""
    attempt_ids = [
        r[0] for r in db.execute("SELECT attempt_id FROM attempts WHERE rollout_id = ? ORDER BY number", (rollout_id,))
    ]
    if not attempt_ids and db.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
        raise NotFoundError(f"unknown rollout {rollout_id!r}")
    spans: list[Span] = []
    for aid in chosen_attempts(rollout_id, attempt_ids, attempt_id):
        rows = db.execute(
            "SELECT sequence_id, data, prompt_ids, response_ids, response_logprobs FROM spans"
            " WHERE attempt_id = ? ORDER BY sequence_id",
            (aid,),
        )
        for seq, data, *blobs in rows:
            span = read_row(Span, data)
            span.sequence_id = seq
            if blobs != [None, None, None]:
                restore_attributes(span.attributes, tuple(blobs))
            spans.append(span)
    return spans
