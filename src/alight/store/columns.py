"""The trainer's bulk read, as every store answers it: many rollouts' LLM calls as flat numpy columns.

`Store.llm_columns(rollout_ids)` returns an `LLMColumns`: the latest attempt of each rollout, its
"lean" LLM spans (token ids and log-probs that int32 / float64 hold exactly, an agent name that is a
string or absent) as flat arrays with per-span lengths, and its other spans as dicts. LightningRL's
columnar path (`alight.algorithms.columnar`) builds a whole step's batch from it with no Python
object per call. The SQLite store reads the columns straight from its binary columns
(`alight.store.sqlite_columns`); any other store builds them from its spans (`columns_from_spans`);
the HTTP server sends them as one binary body (`encode_columns` / `decode_columns`), so a store
across the network gives the trainer the same columns.
"""

from __future__ import annotations

import contextlib
import gc
import math
import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from alight.errors import StoreError
from alight.semconv import AGENT_NAME, LLM_PROMPT_TOKEN_IDS, LLM_RESPONSE_LOGPROBS, LLM_RESPONSE_TOKEN_IDS
from alight.types import Span, SpanKind

#: dtypes of token ids and log-probs in columns and on the wire (little-endian, as SQLite keeps them).
ID_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f8")
#: The attributes a lean LLM span holds as arrays, with their array typecodes.
ID_ATTRIBUTES = (LLM_PROMPT_TOKEN_IDS, LLM_RESPONSE_TOKEN_IDS, LLM_RESPONSE_LOGPROBS)
TYPECODES = ("i", "i", "d")

Ints = npt.NDArray[np.int64]


def _no_ints() -> Ints:
    return np.zeros(0, dtype=np.int64)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: a bulk read allocates millions of containers and no cycle, and the
    collections it would trigger (rescanning every live object) double its time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(slots=True)
class LLMColumns:
    """The latest attempt of each rollout, its lean LLM spans as columns and its other spans as dicts.

    Per rollout (the order given, duplicates dropped): `rollout_ids`, `attempt_ids` (None: never
    claimed), `group_ids`, `rewards` (Rollout.reward). Per lean LLM span, rollouts in order, each
    rollout's spans by sequence id: `rollout_index`, `sequence_ids`, `span_ids`, `agents` (the
    agent name, None when the span has none), `parent_ids` (only where `agents` is None), and flat
    `prompt_ids`/`response_ids` (int32) and `logprobs` (float64) with each span's
    `prompt_lengths`, `response_lengths`, `logprob_lengths`. `other_spans`: (rollout index, span dict
    in Span's JSON shape with its `sequence_id`) of every other span but agent spans (and tool spans
    unless asked for), in the same order; a store may leave the id attributes out of these dicts.
    `other_index`, `other_sequence_ids`: their rollout indices and sequence ids.
    """

    rollout_ids: list[str] = field(default_factory=list)
    attempt_ids: list[str | None] = field(default_factory=list)
    group_ids: list[str | None] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    rollout_index: Ints = field(default_factory=_no_ints)
    sequence_ids: Ints = field(default_factory=_no_ints)
    span_ids: Sequence[str] = ()
    agents: Sequence[str | None] = ()
    parent_ids: Sequence[str | None] = ()
    prompt_ids: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=ID_DTYPE))
    response_ids: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=ID_DTYPE))
    logprobs: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0, dtype=LOGPROB_DTYPE))
    prompt_lengths: Ints = field(default_factory=_no_ints)
    response_lengths: Ints = field(default_factory=_no_ints)
    logprob_lengths: Ints = field(default_factory=_no_ints)
    other_spans: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    other_index: Ints = field(default_factory=_no_ints)
    other_sequence_ids: Ints = field(default_factory=_no_ints)


def pack(value: Any, typecode: str) -> array[Any] | None:
    """`value` as an array of `typecode` ("i": int32, "d": float64) when it reads back exactly equal
    and of the same types (a list of plain ints in range, of finite floats), else None."""
    if type(value) is not list:
        return None
    try:
        packed = array(typecode, value)
    except (TypeError, OverflowError):
        return None
    if typecode == "i":
        if bool in set(map(type, value)):  # True would read back as 1
            return None
    elif not math.isfinite(sum(packed)) or set(map(type, value)) - {float}:  # JSON turns NaN/inf into null
        return None
    return packed


# -- any store: columns from its spans ------------------------------------------------------------


def unread_kinds(tool_spans: bool) -> frozenset[str]:
    """Span kinds `other_spans` leaves out: agent spans, and tool spans unless asked for."""
    return frozenset({SpanKind.AGENT.value} if tool_spans else {SpanKind.AGENT.value, SpanKind.TOOL.value})


def columns_from_spans(
    rollouts: Sequence[Mapping[str, Any]],
    attempt_ids: Sequence[str | None],
    spans: Mapping[str, Sequence[Span]],
    *,
    tool_spans: bool = False,
) -> LLMColumns:
    """The columns of `rollouts` (dicts in Rollout's JSON shape, one per id, no duplicates) whose
    latest attempts are `attempt_ids` and whose spans (that attempt's, by sequence id) are
    `spans[rollout_id]`: what `SqliteStore.llm_columns` reads, for stores without binary columns."""
    out = LLMColumns(
        rollout_ids=[r["rollout_id"] for r in rollouts],
        attempt_ids=list(attempt_ids),
        group_ids=[r.get("group_id") for r in rollouts],
        rewards=[r.get("reward") for r in rollouts],
    )
    unread = unread_kinds(tool_spans)
    index: list[int] = []
    seqs: list[int] = []
    span_ids: list[str] = []
    agents: list[str | None] = []
    parents: list[str | None] = []
    runs: tuple[list[array[Any]], list[array[Any]], list[array[Any]]] = ([], [], [])
    other_index: list[int] = []
    other_seqs: list[int] = []
    with gc_paused():
        for i, rollout_id in enumerate(out.rollout_ids):
            for span in spans.get(rollout_id, ()):
                lean = _lean_arrays(span)
                if lean is None:
                    if str(span.kind) not in unread:
                        out.other_spans.append((i, span.model_dump(mode="json")))
                        other_index.append(i)
                        other_seqs.append(span.sequence_id or 0)
                    continue
                index.append(i)
                seqs.append(span.sequence_id or 0)
                span_ids.append(span.span_id)
                agent = span.attributes.get(AGENT_NAME)
                agents.append(agent)
                parents.append(span.parent_id if agent is None else None)
                for run, packed in zip(runs, lean, strict=True):
                    run.append(packed)
    out.rollout_index, out.sequence_ids = np.array(index, dtype=np.int64), np.array(seqs, dtype=np.int64)
    out.span_ids, out.agents, out.parent_ids = span_ids, agents, parents
    out.prompt_ids, out.response_ids = _joined(runs[0], ID_DTYPE), _joined(runs[1], ID_DTYPE)
    out.logprobs = _joined(runs[2], LOGPROB_DTYPE)
    lengths = [np.fromiter(map(len, run), dtype=np.int64, count=len(run)) for run in runs]
    out.prompt_lengths, out.response_lengths, out.logprob_lengths = lengths[0], lengths[1], lengths[2]
    out.other_index, out.other_sequence_ids = np.array(other_index, dtype=np.int64), np.array(other_seqs, np.int64)
    return out


def _lean_arrays(span: Span) -> tuple[array[Any], ...] | None:
    """The three id arrays of a lean LLM span, or None for any other span."""
    if str(span.kind) != SpanKind.LLM.value:
        return None
    attributes = span.attributes
    agent = attributes.get(AGENT_NAME)
    if agent is not None and type(agent) is not str:
        return None
    packed = []
    for key, typecode in zip(ID_ATTRIBUTES, TYPECODES, strict=True):
        one = pack(attributes.get(key), typecode)
        if one is None:
            return None
        packed.append(one)
    return tuple(packed)


def _joined(run: list[array[Any]], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    if not run:
        return np.zeros(0, dtype=dtype)
    joined = array(run[0].typecode)
    for part in run:
        joined.extend(part)
    return np.frombuffer(joined, dtype=dtype.newbyteorder("=")).astype(dtype, copy=False)


# -- the wire: one binary body --------------------------------------------------------------------

_MAGIC = b"ALC1"
_HEAD = struct.Struct("<4sI")  # magic, header length
_ALIGN = 8
#: The array fields of LLMColumns in wire order, with their dtypes.
_ARRAYS: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("rollout_index", np.dtype("<i8")),
    ("sequence_ids", np.dtype("<i8")),
    ("prompt_ids", ID_DTYPE),
    ("response_ids", ID_DTYPE),
    ("logprobs", LOGPROB_DTYPE),
    ("prompt_lengths", np.dtype("<i8")),
    ("response_lengths", np.dtype("<i8")),
    ("logprob_lengths", np.dtype("<i8")),
    ("other_index", np.dtype("<i8")),
    ("other_sequence_ids", np.dtype("<i8")),
)
_LISTS = ("rollout_ids", "attempt_ids", "group_ids", "rewards", "span_ids", "agents", "parent_ids")
MEDIA_TYPE = "application/vnd.alight.columns"


def encode_columns(cols: LLMColumns) -> bytes:
    """`cols` as one body: a small header, a JSON part with the per-rollout and per-span strings,
    then every array's bytes as they are (8-byte aligned), so decoding copies no array."""
    head: dict[str, Any] = {name: list(getattr(cols, name)) for name in _LISTS}
    head["other_spans"] = cols.other_spans
    parts: list[bytes] = []
    counts = []
    for name, dtype in _ARRAYS:
        values = np.ascontiguousarray(getattr(cols, name), dtype=dtype)
        counts.append(len(values))
        data = values.tobytes()
        parts.append(data + b"\0" * (-len(data) % _ALIGN))
    head["counts"] = counts
    text = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    text += b" " * (-(len(text) + _HEAD.size) % _ALIGN)
    return b"".join([_HEAD.pack(_MAGIC, len(text)), text, *parts])


def decode_columns(body: bytes) -> LLMColumns:
    """The columns `encode_columns` wrote; StoreError for a body that is not one."""
    try:
        magic, size = _HEAD.unpack_from(body)
        if magic != _MAGIC:
            raise ValueError("not a columns body")
        head = orjson.loads(body[_HEAD.size : _HEAD.size + size])
        cols = LLMColumns(**{name: head[name] for name in _LISTS})
        cols.other_spans = [(int(i), span) for i, span in head["other_spans"]]
        offset = _HEAD.size + size
        for (name, dtype), count in zip(_ARRAYS, head["counts"], strict=True):
            setattr(cols, name, np.frombuffer(body, dtype=dtype, count=count, offset=offset))
            offset += count * dtype.itemsize
            offset += -offset % _ALIGN
    except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as err:
        raise StoreError(f"bad columns body from the store: {err}") from None
    return cols
