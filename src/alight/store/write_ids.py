"""Write ids: a retried write is applied once, even across a restart of the store.

A caller that may retry a write (the HTTP client, whose request may have been applied before its
answer was lost) names it with a write id. The store records the id with the write's answer in the
same transaction as the write, so a retry with the same id, before or after a crash and restart,
gets the first answer back and changes nothing. Writes that are idempotent by their own ids
(enqueue by rollout id, dequeue by attempt id, start, heartbeat, a finish repeated with the same
status) need none; publishing resources (each call makes a new version) and reaping (each call may
time out other attempts) do, and so do span writes: spans are stored once by attempt and span id,
but the answer (how many were new) must be the first one's, also after a restart.

The record is bounded: ids older than `retention_s` (default 24 hours) are dropped, and beyond
`max_ids` (default 100,000) the oldest go first. A retry comes within seconds of its first try
(the HTTP client gives up after about 10 s), so either bound leaves ample margin.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from alight.errors import ConfigError, InvalidRequestError
from alight.types import Attempt

if TYPE_CHECKING:
    import sqlite3

#: Keep a write id this long (seconds) ...
DEFAULT_RETENTION_S = 24 * 3600.0
#: ... and at most this many ids, the oldest dropped first.
DEFAULT_MAX_IDS = 100_000
# SQLite prunes once every this many recorded ids (and when the store opens), not on every write.
_PRUNE_EVERY = 1024


@dataclass(frozen=True)
class WriteIdLimits:
    """How long and how many write ids a store keeps."""

    retention_s: float = DEFAULT_RETENTION_S  # seconds a write id is remembered
    max_ids: int = DEFAULT_MAX_IDS  # write ids remembered at most, the oldest dropped first

    def __post_init__(self) -> None:
        if not math.isfinite(self.retention_s) or self.retention_s <= 0:
            raise ConfigError(f"write-id retention must be a finite number of seconds > 0, got {self.retention_s}")
        if isinstance(self.max_ids, bool) or not isinstance(self.max_ids, int) or self.max_ids < 1:
            raise ConfigError(f"max write ids must be a whole number >= 1, got {self.max_ids!r}")


def attempts_json(attempts: list[Attempt]) -> str:
    """A reap's answer as recorded (`attempts_from_json` reads it back)."""
    return orjson.dumps([a.model_dump(mode="json") for a in attempts]).decode()


def attempts_from_json(answer: str) -> list[Attempt]:
    return [Attempt.model_validate(a) for a in orjson.loads(answer)]


def _checked(write_id: str, kind: str, found_kind: str) -> None:
    if found_kind != kind:
        raise InvalidRequestError(f"write id {write_id!r} was already used by a {found_kind} write, not {kind}")


class MemoryWriteIds:
    """The in-memory record (MemoryStore): write id -> (kind, answer, time), oldest first."""

    def __init__(self, limits: WriteIdLimits) -> None:
        self._limits = limits
        self._answers: OrderedDict[str, tuple[str, str, float]] = OrderedDict()

    def recall(self, write_id: str | None, kind: str) -> str | None:
        """The answer recorded for `write_id` (JSON text), or None for a new or absent id."""
        if write_id is None:
            return None
        self._prune(time.time())
        found = self._answers.get(write_id)
        if found is None:
            return None
        _checked(write_id, kind, found[0])
        return found[1]

    def remember(self, write_id: str | None, kind: str, answer: str) -> None:
        if write_id is None:
            return
        self._answers[write_id] = (kind, answer, time.time())
        while len(self._answers) > self._limits.max_ids:
            self._answers.popitem(last=False)

    def _prune(self, at: float) -> None:
        cutoff = at - self._limits.retention_s
        while self._answers and next(iter(self._answers.values()))[2] < cutoff:
            self._answers.popitem(last=False)


class SqliteWriteIds:
    """The durable record (SqliteStore), in the `write_ids` table; every call runs inside the
    caller's write transaction, so the write and its id commit together."""

    def __init__(self, limits: WriteIdLimits) -> None:
        self._limits = limits
        self._since_prune = 0

    def recall(self, db: sqlite3.Connection, write_id: str | None, kind: str) -> str | None:
        """The answer recorded for `write_id` (JSON text), or None for a new or absent id."""
        if write_id is None:
            return None
        row = db.execute("SELECT kind, answer FROM write_ids WHERE write_id = ?", (write_id,)).fetchone()
        if row is None:
            return None
        _checked(write_id, kind, row[0])
        return str(row[1])

    def remember(self, db: sqlite3.Connection, write_id: str | None, kind: str, answer: str) -> None:
        if write_id is None:
            return
        db.execute(
            "INSERT INTO write_ids (write_id, kind, answer, created_at) VALUES (?, ?, ?, ?)",
            (write_id, kind, answer, time.time()),
        )
        self._since_prune += 1
        if self._since_prune >= _PRUNE_EVERY:
            self.prune(db)

    def prune(self, db: sqlite3.Connection) -> None:
        """Drop ids past the retention time and the oldest beyond `max_ids`."""
        self._since_prune = 0
        db.execute("DELETE FROM write_ids WHERE created_at < ?", (time.time() - self._limits.retention_s,))
        db.execute("DELETE FROM write_ids WHERE seq <= (SELECT MAX(seq) FROM write_ids) - ?", (self._limits.max_ids,))
