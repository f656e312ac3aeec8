"""Spans as plain data: the adapter reads `Span` objects and dicts in Span's JSON shape alike.

A bulk reader (the SQLite store, orjson) hands dicts; the stores and tests hand `Span` objects,
whose field dict has the same keys (`kind` and `status` are str enums, equal to their values). Both
are read as mappings, with no pydantic validation or copying on the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any

from alight import semconv
from alight.types import Span

#: What the adapter accepts as a span: a `Span`, or a mapping with Span's JSON keys.
SpanLike = Span | Mapping[str, Any]
#: A span read as a mapping with Span's JSON keys.
SpanData = Mapping[str, Any]

_INF = float("inf")
_SEQUENCE_AND_START = itemgetter("sequence_id", "start_time")


def span_data(span: SpanLike) -> SpanData:
    """A span as a mapping with Span's JSON keys (a `Span`'s own field dict: no copy)."""
    return span.__dict__ if isinstance(span, Span) else span


def ordered_spans(spans: Iterable[SpanLike]) -> tuple[list[SpanData], int]:
    """One attempt's spans in attempt order, and how many spans of other attempts were dropped.

    Order: `sequence_id`, ties broken by `start_time`, then by input order (the sort is stable);
    spans without a sequence id come last. When the spans come from several attempts, only the
    attempt of the latest-starting span is kept (the store's default query returns one attempt).
    """
    data = [span if type(span) is dict else span_data(span) for span in spans]
    dropped = 0
    if data:
        attempts = {item.get("attempt_id") for item in data}
        if len(attempts) > 1:
            attempt = max(data, key=_start_time).get("attempt_id")
            kept = [item for item in data if item.get("attempt_id") == attempt]
            dropped = len(data) - len(kept)
            data = kept
        try:  # the common case, every span numbered and timed: a C-level key
            data = sorted(data, key=_SEQUENCE_AND_START)
        except (TypeError, KeyError):  # a missing sequence id or start time (`data` is left as it was)
            data.sort(key=_order_key)
    return data, dropped


def _start_time(span: SpanData) -> float:
    return float(span.get("start_time") or 0.0)


def _order_key(span: SpanData) -> tuple[float, float]:
    seq = span.get("sequence_id")
    return (_INF if seq is None else seq), (span.get("start_time") or 0.0)


def attributes_of(span: SpanData) -> Mapping[str, Any]:
    """The span's attributes ({} when absent)."""
    attributes: Mapping[str, Any] = span.get("attributes") or {}
    return attributes


def agent_spans(spans: Iterable[SpanData]) -> dict[str, str]:
    """Agent name by span id of the agent spans, for calls that only name their parent span."""
    out: dict[str, str] = {}
    for span in spans:
        if span.get("kind") == "agent" and span.get("span_id") is not None:
            out[span["span_id"]] = str(attributes_of(span).get(semconv.AGENT_NAME) or span.get("name"))
    return out


def is_final_reward(span: SpanData) -> bool:
    """A reward span holding the value the agent returned (the runner names it "final")."""
    return attributes_of(span).get(semconv.REWARD_NAME) == "final"


def reward_value(span: SpanData) -> float | None:
    """The value of a reward span, or None when it holds no number."""
    value = attributes_of(span).get(semconv.REWARD_VALUE)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
