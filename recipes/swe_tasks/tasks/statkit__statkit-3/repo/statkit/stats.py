"""Descriptive statistics over sequences of numbers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    """The middle value of `values`."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty sequence")
    middle = len(ordered) // 2
    return ordered[middle]


def mode(values: Sequence[float]) -> float:
    """The most common value; the smallest of them on a tie."""
    if not values:
        raise ValueError("mode of an empty sequence")
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)
