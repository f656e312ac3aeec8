"""The SQLite store's schema, its migration, and how a span becomes a row and back.

LLM spans carry hundreds of token ids and log-probs; as JSON they cost the trainer's bulk read a
Python object each. So a span row keeps the token ids (int32) and log-probs (float64, exact) of an
LLM span in binary columns, little-endian, and its JSON without those attributes; a few scalar
columns (kind, name, parent, start time, agent name; filled only on rows with binary ids) let the
bulk read build an LLM span's dict without parsing JSON at all (`alight.store.sqlite_bulk`). A
value that binary cannot hold exactly (not a list of plain ints in int32 range, not a list of
finite floats) stays in the JSON, and so do all attributes of rows written by schema version 1:
every read restores the attributes from whichever place holds them, so a `Span` reads back as it
was written.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import sys
from array import array
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from alight.errors import StoreError
from alight.semconv import AGENT_NAME
from alight.store.columns import ID_ATTRIBUTES, TYPECODES, pack
from alight.types import Span, SpanKind

logger = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)
# Required float fields a non-finite number may have emptied (pydantic writes NaN as null).
_TIME_DEFAULTS = {"start_time": 0.0, "created_at": 0.0, "claimed_at": 0.0, "last_heartbeat_at": 0.0}


def read_row(model: type[_M], data: str | bytes) -> _M:
    """A stored row's JSON as `model`. A row written before non-finite numbers were refused (a NaN
    stored as NaN or null) still reads: such a number reads as null, or 0.0 where one is required."""
    try:
        return model.model_validate_json(data)
    except ValidationError:
        raw = json.loads(data)  # the standard parser reads NaN and Infinity
        if not isinstance(raw, dict):
            raise
        fixed = {key: None if isinstance(v, float) and not math.isfinite(v) else v for key, v in raw.items()}
        for key, default in _TIME_DEFAULTS.items():
            if key in fixed and fixed[key] is None:
                fixed[key] = default
        logger.warning("store: a stored %s had a non-finite number; read as null", model.__name__)
        return model.model_validate(fixed)


#: Version 2 added the binary id columns and the scalar span columns; version 1 files migrate in place.
#: Version 3 added the `write_ids` table (`alight.store.write_ids`); version 2 files migrate in place.
SCHEMA_VERSION = 3

SCHEMA = """
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
    kind TEXT,
    name TEXT,
    parent_id TEXT,
    start_time REAL,
    agent TEXT,
    prompt_ids BLOB,
    response_ids BLOB,
    response_logprobs BLOB,
    PRIMARY KEY (attempt_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_in_order ON spans (attempt_id, sequence_id);
CREATE TABLE IF NOT EXISTS resources (version INTEGER PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS write_ids (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    write_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    answer TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS write_ids_by_age ON write_ids (created_at);
"""

#: Columns version 2 added to `spans` (a version 1 file gets them with ALTER TABLE; old rows hold NULL).
_NEW_SPAN_COLUMNS = (
    ("kind", "TEXT"),
    ("name", "TEXT"),
    ("parent_id", "TEXT"),
    ("start_time", "REAL"),
    ("agent", "TEXT"),
    ("prompt_ids", "BLOB"),
    ("response_ids", "BLOB"),
    ("response_logprobs", "BLOB"),
)

_INSERT_BINARY = (
    "INSERT OR IGNORE INTO spans (attempt_id, span_id, rollout_id, sequence_id, data, kind, name, parent_id,"
    " start_time, agent, prompt_ids, response_ids, response_logprobs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Rows without binary ids leave the other columns NULL: binding 8 NULLs costs about 1 us a span.
_INSERT_PLAIN = (
    "INSERT OR IGNORE INTO spans (attempt_id, span_id, rollout_id, sequence_id, data) VALUES (?, ?, ?, ?, ?)"
)

_ID_SET = frozenset(ID_ATTRIBUTES)
_LLM = SpanKind.LLM.value
_SWAP = sys.byteorder != "little"  # the file is little-endian wherever it was written


def check_schema(db: sqlite3.Connection, path: object) -> None:
    """Record the version of a new file, migrate a version 1 or 2 file in place; inside a write transaction.
    (`SCHEMA` has already created the tables a newer version added, `write_ids` among them.)

    Raises StoreError for a file written by a newer alight."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return
    version = int(row[0])
    if version == SCHEMA_VERSION:
        return
    if version not in (1, 2):
        raise StoreError(f"store {path} has schema version {version}, this alight reads {SCHEMA_VERSION}")
    present = {r[1] for r in db.execute("PRAGMA table_info(spans)")}
    for name, sql_type in _NEW_SPAN_COLUMNS:
        if name not in present:
            db.execute(f"ALTER TABLE spans ADD COLUMN {name} {sql_type}")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def _pack(value: Any, typecode: str) -> bytes | None:
    """`value` as little-endian binary when it reads back exactly equal (and of the same types), else None."""
    packed = pack(value, typecode)
    if packed is None:
        return None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def span_row(span: Span, sequence_id: int) -> tuple[Any, ...]:
    """The row of `span` for `insert_spans` (the sequence_id column is authoritative)."""
    attributes, kind = span.attributes, str(span.kind)  # StrEnum: its value (`.value` is a slow property)
    agent = attributes.get(AGENT_NAME)
    blobs: list[bytes | None] = [None, None, None]
    exclude: set[str] = set()
    # Only LLM spans whose agent name a column can hold: the bulk read rebuilds them from columns.
    if kind == _LLM and (agent is None or type(agent) is str) and not _ID_SET.isdisjoint(attributes):
        for i, (key, typecode) in enumerate(zip(ID_ATTRIBUTES, TYPECODES, strict=True)):
            if key in attributes:
                blobs[i] = _pack(attributes[key], typecode)
                if blobs[i] is not None:
                    exclude.add(key)
    if not exclude:  # everything in the JSON; the scalar columns only serve rows with binary ids
        return (span.attempt_id, span.span_id, span.rollout_id, sequence_id, span.model_dump_json())
    return (
        span.attempt_id,
        span.span_id,
        span.rollout_id,
        sequence_id,
        span.model_dump_json(exclude={"attributes": exclude}),
        kind,
        span.name,
        span.parent_id,
        span.start_time,
        agent if type(agent) is str else None,
        *blobs,
    )


def insert_spans(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert `span_row` rows, ignoring spans already stored (same attempt and span id)."""
    plain = [row for row in rows if len(row) == 5]
    if plain:
        db.executemany(_INSERT_PLAIN, plain)
    if len(plain) < len(rows):
        db.executemany(_INSERT_BINARY, [row for row in rows if len(row) != 5])


def unpack_list(blob: bytes, typecode: str) -> list[Any]:
    """A binary column back as the list of Python ints or floats it was written from."""
    values = array(typecode)
    values.frombytes(blob)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def restore_attributes(attributes: dict[str, Any], blobs: tuple[bytes | None, ...]) -> None:
    """Put the binary-held attributes of a row back into its JSON attributes, as lists."""
    for key, typecode, blob in zip(ID_ATTRIBUTES, TYPECODES, blobs, strict=True):
        if blob is not None:
            attributes[key] = unpack_list(blob, typecode)
