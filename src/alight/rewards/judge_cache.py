"""Judge scores cached by a hash of the judge's input (reward.judge.cache).

The key is the SHA-256 of everything that decides a judgement: the judge model (and its endpoint),
the messages (the rubric with the task and the answer in it), the sampling (temperature,
max_tokens), the score scale and, for `model: policy`, the resource-set version of the rollout
(the policy judge changes as it trains). Two levels: a per-process LRU in front of a SQLite file
(`judge_cache.sqlite` in the run directory), which every runner process of the run shares; where
that file cannot be opened (a runner on another machine), the LRU alone. Only scores are cached:
a malformed answer is asked again next time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections import OrderedDict
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The cache file's name in the run directory.
CACHE_FILE = "judge_cache.sqlite"
#: Scores each process keeps in memory.
LRU_SIZE = 4096
_SCHEMA = "CREATE TABLE IF NOT EXISTS judge_scores (key TEXT PRIMARY KEY, score REAL NOT NULL)"


def judgement_key(**inputs: Any) -> str:
    """The cache key of one judgement: a hash of its inputs (JSON, keys sorted)."""
    text = json.dumps(inputs, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    """Scores by judgement key: an LRU of `size` entries, backed by the SQLite file `path` if given."""

    def __init__(self, path: Path | None = None, size: int = LRU_SIZE) -> None:
        self.path = path
        self.size = size
        self._memory: OrderedDict[str, float] = OrderedDict()
        self._db: sqlite3.Connection | None = None
        self._db_failed = path is None

    def get(self, key: str) -> float | None:
        """The cached score of `key`, or None."""
        score = self._memory.get(key)
        if score is not None:
            self._memory.move_to_end(key)
            return score
        db = self._connection()
        if db is None:
            return None
        try:
            row = db.execute("SELECT score FROM judge_scores WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as err:
            self._give_up(err)
            return None
        if row is None:
            return None
        self._remember(key, float(row[0]))
        return float(row[0])

    def put(self, key: str, score: float) -> None:
        """Remember `score` for `key` (in memory, and in the file when there is one)."""
        self._remember(key, score)
        db = self._connection()
        if db is None:
            return
        try:
            with db:
                db.execute("INSERT OR REPLACE INTO judge_scores (key, score) VALUES (?, ?)", (key, score))
        except sqlite3.Error as err:
            self._give_up(err)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _remember(self, key: str, score: float) -> None:
        self._memory[key] = score
        self._memory.move_to_end(key)
        while len(self._memory) > self.size:
            self._memory.popitem(last=False)

    def _connection(self) -> sqlite3.Connection | None:
        if self._db is not None or self._db_failed:
            return self._db
        assert self.path is not None
        try:
            if not self.path.parent.is_dir():
                raise sqlite3.OperationalError(f"no directory {self.path.parent}")
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")  # runner processes read while one writes
            db.execute(_SCHEMA)
        except sqlite3.Error as err:
            self._give_up(err)
            return None
        self._db = db
        return db

    def _give_up(self, err: sqlite3.Error) -> None:
        """Go on with the in-memory cache alone (a judgement is never lost to a cache problem)."""
        logger.warning("judge cache %s unusable (%s); caching in memory only", self.path, err)
        self.close()
        self._db_failed = True

    def __getstate__(self) -> dict[str, Any]:  # a connection does not travel to other processes
        return {"path": self.path, "size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["size"])  # type: ignore[misc]
