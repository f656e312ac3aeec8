"""SQLite store: the default for runs. One file, WAL mode, safe across processes, durable.

Every write is one `BEGIN IMMEDIATE` transaction, so concurrent processes on the same file are
serialised by SQLite's write lock and a dequeue can never hand one attempt out twice. With WAL and
`synchronous=NORMAL`, a committed transaction survives the process being killed (only a power
loss can drop the last commits; pass `synchronous="FULL"` to survive that too).

Crash recovery: each process holds a shared `flock` on `<db>.lock` while the store is open. The
first process to open the file after every earlier user has gone (the lock is free) recovers the
attempts that were live when they stopped: they end as timed out and their rollouts are requeued.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

from alight.errors import NotFoundError, StoreError
from alight.store import lifecycle
from alight.store.base import EndSignal, Store, all_status_counts, wait_until_ended
from alight.types import (
    Attempt,
    AttemptStatus,
    Claim,
    Resource,
    ResourceSet,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    new_id,
    now,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    mode TEXT NOT NULL,
    group_id TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts (status, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts (group_id);
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS attempts_by_rollout ON attempts (rollout_id, number);
CREATE INDEX IF NOT EXISTS attempts_live ON attempts (status) WHERE status IN ('preparing', 'running');
CREATE TABLE IF NOT EXISTS spans (
    attempt_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (attempt_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_in_order ON spans (attempt_id, sequence_id);
CREATE TABLE IF NOT EXISTS resources (version INTEGER PRIMARY KEY, data TEXT NOT NULL);
"""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: decoding JSON allocates millions of containers and no cycle, and the
    collections it would trigger (rescanning every live object) double the time of a bulk read."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_LIVE = (AttemptStatus.PREPARING.value, AttemptStatus.RUNNING.value)
_TERMINAL = tuple(s.value for s in RolloutStatus if s.is_terminal)


class SqliteStore(Store):
    """A store in one SQLite file; several processes may open the same file at once."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_s: float = 60.0,
        poll_s: float = 0.1,
    ) -> None:
        self.path = Path(path)
        self._poll_s = poll_s
        self._ended = EndSignal()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f"cannot open store {self.path}: {err}") from None
        with self._write():
            self._check_schema()
        self._recover_if_first()

    # -- plumbing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding SQLite's write lock from the start."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_schema(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"store {self.path} has schema version {row[0]}, this alight reads {SCHEMA_VERSION}")

    def _recover_if_first(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another live process has the store open: its attempts are not lost
        else:
            recovered = self._recover()
            if recovered:
                logger.warning("store %s: requeued %d attempts lost in a crash", self.path, recovered)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)

    def _recover(self) -> int:
        at = now()
        with self._write():
            live = self._live_attempts()
            for attempt in live:
                rollout, ended = lifecycle.recover(self._rollout(attempt.rollout_id), attempt, at)
                self._put_attempt(ended)
                self._put_rollout(rollout)
        return len(live)

    def _rollout(self, rollout_id: str) -> Rollout:
        row = self._db.execute("SELECT data FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")
        return Rollout.model_validate_json(row[0])

    def _attempt(self, attempt_id: str) -> Attempt:
        row = self._db.execute("SELECT data FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown attempt {attempt_id!r}")
        return Attempt.model_validate_json(row[0])

    def _live_attempts(self) -> list[Attempt]:
        rows = self._db.execute("SELECT data FROM attempts WHERE status IN (?, ?) ORDER BY rowid", _LIVE)
        return [Attempt.model_validate_json(r[0]) for r in rows]

    def _put_rollout(self, rollout: Rollout) -> None:
        self._db.execute(
            "UPDATE rollouts SET status = ?, data = ? WHERE rollout_id = ?",
            (rollout.status.value, rollout.model_dump_json(), rollout.rollout_id),
        )
        if rollout.status.is_terminal:
            self._ended.notify()

    def _put_attempt(self, attempt: Attempt) -> None:
        self._db.execute(
            "INSERT INTO attempts (attempt_id, rollout_id, number, status, data) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (attempt_id) DO UPDATE SET status = excluded.status, data = excluded.data",
            (
                attempt.attempt_id,
                attempt.rollout_id,
                attempt.number,
                attempt.status.value,
                attempt.model_dump_json(),
            ),
        )

    # -- queue ------------------------------------------------------------------------------
    async def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        admitted = [lifecycle.admit(r, now()) for r in rollouts]
        rows = [(r.rollout_id, r.status.value, r.mode.value, r.group_id, r.model_dump_json()) for r in admitted]
        with self._write() as db:
            db.executemany(
                "INSERT OR IGNORE INTO rollouts (rollout_id, status, mode, group_id, data) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            return [self._rollout(r.rollout_id) for r in rollouts]

    async def dequeue(self, worker_id: str | None = None, *, attempt_id: str | None = None) -> Claim | None:
        with self._write() as db:
            if attempt_id is not None:
                row = db.execute("SELECT data FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
                if row is not None:
                    attempt = Attempt.model_validate_json(row[0])
                    return Claim(rollout=self._rollout(attempt.rollout_id), attempt=attempt)
            row = db.execute(
                "SELECT data FROM rollouts WHERE status = ? ORDER BY seq LIMIT 1",
                (RolloutStatus.QUEUING.value,),
            ).fetchone()
            if row is None:
                return None
            rollout, attempt = lifecycle.claim(
                Rollout.model_validate_json(row[0]), attempt_id or new_id("at"), worker_id, now()
            )
            self._put_rollout(rollout)
            self._put_attempt(attempt)
            return Claim(rollout=rollout, attempt=attempt)

    async def start_attempt(self, attempt_id: str) -> Attempt:
        with self._write():
            attempt = lifecycle.start(self._attempt(attempt_id), now())
            self._put_attempt(attempt)
            return attempt

    async def heartbeat(self, attempt_id: str) -> Attempt:
        with self._write():
            attempt = lifecycle.heartbeat(self._attempt(attempt_id), now())
            self._put_attempt(attempt)
            return attempt

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
    ) -> Rollout:
        with self._write():
            attempt = self._attempt(attempt_id)
            rollout, attempt = lifecycle.finish_attempt(
                self._rollout(attempt.rollout_id), attempt, status, now(), reward=reward, error=error
            )
            self._put_attempt(attempt)
            self._put_rollout(rollout)
            return rollout

    async def finish_rollout(self, rollout_id: str, status: RolloutStatus, *, reward: float | None = None) -> Rollout:
        with self._write() as db:
            rollout = self._rollout(rollout_id)
            row = db.execute(
                "SELECT data FROM attempts WHERE rollout_id = ? ORDER BY number DESC LIMIT 1", (rollout_id,)
            ).fetchone()
            live = Attempt.model_validate_json(row[0]) if row is not None else None
            rollout, attempt = lifecycle.finish_rollout(rollout, live, status, now(), reward=reward)
            if attempt is not None:
                self._put_attempt(attempt)
            self._put_rollout(rollout)
            return rollout

    # -- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        if not spans:
            return 0
        with self._write() as db:
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
                rows.append((span.attempt_id, span.span_id, span.rollout_id, seq, span.model_dump_json()))
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO spans (attempt_id, span_id, rollout_id, sequence_id, data)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            return db.total_changes - before

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        attempt_ids = [
            r[0]
            for r in self._db.execute(
                "SELECT attempt_id FROM attempts WHERE rollout_id = ? ORDER BY number", (rollout_id,)
            )
        ]
        if not attempt_ids:
            self._rollout(rollout_id)  # raises NotFoundError for an unknown rollout
        if attempt_id is None:
            chosen = attempt_ids[-1:]
        elif attempt_id == "all":
            chosen = attempt_ids
        elif attempt_id in attempt_ids:
            chosen = [attempt_id]
        else:
            raise NotFoundError(f"attempt {attempt_id!r} is not in rollout {rollout_id!r}")
        spans: list[Span] = []
        for aid in chosen:
            rows = self._db.execute(
                "SELECT sequence_id, data FROM spans WHERE attempt_id = ? ORDER BY sequence_id", (aid,)
            )
            for seq, data in rows:
                span = Span.model_validate_json(data)
                span.sequence_id = seq
                spans.append(span)
        return spans

    async def span_dicts(
        self, rollout_ids: Sequence[str], *, all_attempts: bool = False
    ) -> dict[str, list[dict[str, Any]]]:
        """The spans of many rollouts as plain dicts (the stored JSON, `sequence_id` from its column),
        keyed by rollout id in the order given, each list ordered as `query_spans` orders it: the
        latest attempt's spans, or with `all_attempts` every attempt's, first attempt first.

        Two queries whatever the number of rollouts and no pydantic: the trainer's bulk read.
        Raises NotFoundError for an unknown rollout; a rollout never claimed has no spans."""
        ids = list(dict.fromkeys(rollout_ids))
        if not ids:
            return {}
        ids_json = orjson.dumps(ids).decode()
        attempts = self._db.execute(
            "SELECT rollout_id, attempt_id FROM attempts WHERE rollout_id IN (SELECT value FROM json_each(?))"
            " ORDER BY rollout_id, number",
            (ids_json,),
        ).fetchall()
        chosen: dict[str, list[str]] = {}
        for rollout_id, attempt_id in attempts:
            chosen.setdefault(rollout_id, []).append(attempt_id)
        if len(chosen) < len(ids):
            self._check_rollouts_exist([i for i in ids if i not in chosen])
        if not all_attempts:
            chosen = {rid: aids[-1:] for rid, aids in chosen.items()}
        by_attempt: dict[str, list[dict[str, Any]]] = {aid: [] for aids in chosen.values() for aid in aids}
        rows = self._db.execute(
            "SELECT attempt_id, sequence_id, data FROM spans WHERE attempt_id IN (SELECT value FROM json_each(?))"
            " ORDER BY attempt_id, sequence_id",
            (orjson.dumps(list(by_attempt)).decode(),),
        )
        loads = orjson.loads
        with _gc_paused():
            for attempt_id, seq, data in rows:
                span = loads(data)
                span["sequence_id"] = seq
                by_attempt[attempt_id].append(span)
        out: dict[str, list[dict[str, Any]]] = {}
        for rollout_id in ids:
            aids = chosen.get(rollout_id, ())
            out[rollout_id] = by_attempt[aids[0]] if len(aids) == 1 else [s for a in aids for s in by_attempt[a]]
        return out

    async def rollout_dicts(self, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The stored rollouts as plain dicts (Rollout's JSON shape), in the order given, in one
        query and without pydantic: with `span_dicts`, what the adapter reads. NotFoundError for an
        unknown rollout."""
        ids = list(dict.fromkeys(rollout_ids))
        rows = self._db.execute(
            "SELECT rollout_id, data FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(ids).decode(),),
        )
        found = {rollout_id: data for rollout_id, data in rows}
        if len(found) < len(ids):
            self._check_rollouts_exist(ids)
        loads = orjson.loads
        with _gc_paused():
            return [loads(found[rollout_id]) for rollout_id in ids]

    def _check_rollouts_exist(self, rollout_ids: Sequence[str]) -> None:
        known = {
            r[0]
            for r in self._db.execute(
                "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
                (orjson.dumps(list(rollout_ids)).decode(),),
            )
        }
        missing = [i for i in rollout_ids if i not in known]
        if missing:
            raise NotFoundError(f"unknown rollout {missing[0]!r}")

    # -- reading ----------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        return self._rollout(rollout_id)

    async def list_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        ids: Sequence[str] | None = None,
        mode: RolloutMode | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        where, params = [], []
        if status is not None:
            where.append("status IN (SELECT value FROM json_each(?))")
            params.append(orjson.dumps([RolloutStatus(s).value for s in status]).decode())
        if ids is not None:
            where.append("rollout_id IN (SELECT value FROM json_each(?))")
            params.append(orjson.dumps(list(ids)).decode())
        if mode is not None:
            where.append("mode = ?")
            params.append(RolloutMode(mode).value)
        if group_id is not None:
            where.append("group_id = ?")
            params.append(group_id)
        sql = "SELECT data FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq LIMIT ? OFFSET ?"
        rows = self._db.execute(sql, (*params, -1 if limit is None else limit, offset))
        return [Rollout.model_validate_json(r[0]) for r in rows]

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        self._rollout(rollout_id)
        rows = self._db.execute("SELECT data FROM attempts WHERE rollout_id = ? ORDER BY number", (rollout_id,))
        return [Attempt.model_validate_json(r[0]) for r in rows]

    async def count_by_status(self) -> dict[RolloutStatus, int]:
        return all_status_counts(dict(self._db.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status")))

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float) -> list[Rollout]:
        async def ended(ids: Sequence[str]) -> list[Rollout]:
            rows = self._db.execute(
                "SELECT data FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))"
                " AND status IN (SELECT value FROM json_each(?)) ORDER BY seq",
                (orjson.dumps(list(ids)).decode(), orjson.dumps(_TERMINAL).decode()),
            )
            return [Rollout.model_validate_json(r[0]) for r in rows]

        return await wait_until_ended(ended, rollout_ids, timeout, self._ended, poll_s=self._poll_s)

    # -- resources --------------------------------------------------------------------------
    async def add_resources(self, resources: Mapping[str, Resource]) -> ResourceSet:
        with self._write() as db:
            version = db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            resource_set = ResourceSet(version=version, resources=dict(resources), created_at=now())
            db.execute("INSERT INTO resources VALUES (?, ?)", (version, resource_set.model_dump_json()))
            return resource_set

    async def get_latest_resources(self) -> ResourceSet | None:
        row = self._db.execute("SELECT data FROM resources ORDER BY version DESC LIMIT 1").fetchone()
        return ResourceSet.model_validate_json(row[0]) if row is not None else None

    async def get_resources(self, version: int) -> ResourceSet:
        row = self._db.execute("SELECT data FROM resources WHERE version = ?", (version,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown resources version {version}")
        return ResourceSet.model_validate_json(row[0])

    # -- upkeep -----------------------------------------------------------------------------
    async def reap_timed_out(self, at: float | None = None) -> list[Attempt]:
        at = now() if at is None else at
        reaped = []
        with self._write():
            for attempt in self._live_attempts():
                if attempt.expired(at):
                    rollout, ended = lifecycle.expire(self._rollout(attempt.rollout_id), attempt, at)
                    self._put_attempt(ended)
                    self._put_rollout(rollout)
                    reaped.append(ended)
        return reaped

    async def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
