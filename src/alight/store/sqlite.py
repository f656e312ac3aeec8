"""SQLite store: the default for runs. One file, WAL mode, safe across processes, durable.

Every write is one `BEGIN IMMEDIATE` transaction, so concurrent processes on the same file are
serialised by SQLite's write lock and a dequeue can never hand one attempt out twice. With WAL and
`synchronous=NORMAL`, a committed transaction survives the process being killed (only a power
loss can drop the last commits; pass `synchronous="FULL"` to survive that too).

Crash recovery: each process holds a shared `flock` on `<db>.lock` while the store is open. The
first process to open the file after every earlier user has gone (the lock is free) recovers the
attempts that were live when they stopped: they end as timed out and their rollouts are requeued.

Write ids (`alight.store.write_ids`) are recorded in the `write_ids` table in the transaction of
their write, so a write retried after a crash is still applied once.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from alight.errors import ConfigError, NotFoundError, StoreError
from alight.store import lifecycle, sqlite_bulk, sqlite_columns, sqlite_spans, write_ids
from alight.store.base import EndSignal, Store, all_status_counts, wait_until_ended
from alight.store.columns import LLMColumns
from alight.store.factory import OpenOptions, StoreSpec, refuse_url
from alight.store.sqlite_schema import SCHEMA, check_schema, read_row
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

if TYPE_CHECKING:
    from alight.config.schema import StoreConfig

logger = logging.getLogger(__name__)

_LIVE = (AttemptStatus.PREPARING.value, AttemptStatus.RUNNING.value)
_TERMINAL = tuple(s.value for s in RolloutStatus if s.is_terminal)


class SqliteStore(Store):
    """A store in one SQLite file; several processes may open the same file at once."""

    kind = "sqlite"
    is_file = True

    @classmethod
    def check_config(cls, cfg: StoreConfig) -> StoreSpec:
        refuse_url(cfg, cls.kind)
        return StoreSpec(cls.kind, path=Path(cfg.path).expanduser() if cfg.path else None)

    @classmethod
    def from_spec(cls, spec: StoreSpec, options: OpenOptions) -> SqliteStore:
        path = spec.path or options.default_path
        if path is None:
            raise ConfigError(f"store.kind={cls.kind} needs store.path (no run directory to keep store.db in)")
        if not options.create and not path.is_file():
            raise ConfigError(f"{path}: no store file there")
        return cls(path, write_id_limits=options.write_id_limits)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_s: float = 60.0,
        poll_s: float = 0.1,
        write_id_limits: write_ids.WriteIdLimits | None = None,
    ) -> None:
        self.path = Path(path)
        self._poll_s = poll_s
        self._ended = EndSignal()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s)
            # 16 KiB pages (for a new file only): an LLM span's row, with its token ids, fits one page.
            self._db.execute("PRAGMA page_size=16384")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA mmap_size=1073741824")  # bulk reads walk overflow pages: no read() per page
            self._db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f"cannot open store {self.path}: {err}") from None
        self._write_ids = write_ids.SqliteWriteIds(write_id_limits or write_ids.WriteIdLimits())
        with self._write() as db:
            check_schema(db, self.path)
            self._write_ids.prune(db)
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
        return read_row(Rollout, row[0])

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
            rollout, attempt = lifecycle.claim(read_row(Rollout, row[0]), attempt_id or new_id("at"), worker_id, now())
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
    async def add_spans(self, spans: Sequence[Span], *, write_id: str | None = None) -> int:
        if not spans:
            return 0
        with self._write() as db:
            known = self._write_ids.recall(db, write_id, "spans")
            if known is not None:
                return int(known)
            added = sqlite_spans.add_spans(db, spans)
            self._write_ids.remember(db, write_id, "spans", str(added))
            return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        return sqlite_spans.query_spans(self._db, rollout_id, attempt_id)

    # -- bulk reads (see `Store`): a few queries whatever the number of rollouts, no pydantic -----
    async def span_dicts(
        self, rollout_ids: Sequence[str], *, all_attempts: bool = False, arrays: bool = False
    ) -> dict[str, list[dict[str, Any]]]:
        # With `arrays`, an LLM span holding its three id attributes in binary is built from columns
        # without parsing its JSON (`alight.store.sqlite_bulk`).
        return sqlite_bulk.span_dicts(self._db, rollout_ids, all_attempts=all_attempts, arrays=arrays)

    async def rollout_dicts(self, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
        return sqlite_bulk.rollout_dicts(self._db, rollout_ids)

    async def llm_columns(self, rollout_ids: Sequence[str], *, tool_spans: bool = False) -> LLMColumns:
        # One query; the binary columns joined and read with one np.frombuffer each.
        return sqlite_columns.llm_columns(self._db, rollout_ids, tool_spans=tool_spans)

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
        return [read_row(Rollout, r[0]) for r in rows]

    async def get_attempt(self, attempt_id: str) -> Attempt:
        return self._attempt(attempt_id)

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
            return [read_row(Rollout, r[0]) for r in rows]

        return await wait_until_ended(ended, rollout_ids, timeout, self._ended, poll_s=self._poll_s)

    # -- resources --------------------------------------------------------------------------
    async def add_resources(self, resources: Mapping[str, Resource], *, write_id: str | None = None) -> ResourceSet:
        with self._write() as db:
            known = self._write_ids.recall(db, write_id, "resources")
            if known is not None:
                return ResourceSet.model_validate_json(known)
            version = db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            resource_set = ResourceSet(version=version, resources=dict(resources), created_at=now())
            data = resource_set.model_dump_json()
            db.execute("INSERT INTO resources VALUES (?, ?)", (version, data))
            self._write_ids.remember(db, write_id, "resources", data)
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
    async def reap_timed_out(self, at: float | None = None, *, write_id: str | None = None) -> list[Attempt]:
        at = now() if at is None else at
        reaped = []
        with self._write() as db:
            known = self._write_ids.recall(db, write_id, "reap")
            if known is not None:
                return write_ids.attempts_from_json(known)
            for attempt in self._live_attempts():
                if attempt.expired(at):
                    rollout, ended = lifecycle.expire(self._rollout(attempt.rollout_id), attempt, at)
                    self._put_attempt(ended)
                    self._put_rollout(rollout)
                    reaped.append(ended)
            self._write_ids.remember(db, write_id, "reap", write_ids.attempts_json(reaped))
        return reaped

    async def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
