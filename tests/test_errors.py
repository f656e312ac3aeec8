"""`one_line`: the one way an error or a text becomes a one-line message."""

from __future__ import annotations

import pytest

from alight.errors import ConfigError, one_line


@pytest.mark.parametrize(
    ("error", "limit", "expected"),
    [
        (ValueError("bad\n  value\tthere"), 1000, "ValueError: bad value there"),
        (KeyError(), 1000, "KeyError"),
        (RuntimeError("   "), 1000, "RuntimeError"),
        (ConfigError("x"), 1000, "ConfigError: x"),
        ("  several\n\nlines  ", 1000, "several lines"),
        ("abcdefghij", 10, "abcdefghij"),
        ("abcdefghijk", 10, "abcdefg..."),
        (ValueError("x" * 20), 12, "ValueError: "[:9] + "..."),
    ],
)
def test_one_line_collapses_whitespace_names_the_type_and_cuts(
    error: BaseException | str, limit: int, expected: str
) -> None:
    assert one_line(error, limit) == expected
    assert len(one_line(error, limit)) <= limit
