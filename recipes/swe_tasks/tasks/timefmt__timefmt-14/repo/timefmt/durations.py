"""Durations written like `1h30m`."""

from __future__ import annotations

import re

#: Seconds per unit letter.
UNITS = {"h": 3600, "m": 60}
_PART = re.compile(r"(\d+)([a-z])")


def parse_duration(text: str) -> int:
    """Seconds in `text`, a run of <number><unit> parts such as `2h` or `1h30m`."""
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    total, pos = 0, 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        number, unit = match.groups()
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r} in {text!r}")
        total += int(number) * UNITS[unit]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {text!r}")
    return total


def format_duration(seconds: int) -> str:
    """The shortest `1h30m`-style text for whole minutes."""
    hours, minutes = divmod(seconds // 60, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes or not hours else "")
