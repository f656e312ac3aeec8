"""The braille reward chart: a pure function from series to lines of text."""

from __future__ import annotations

import math

import pytest

from alight.dashboard.chart import render_chart

RISING = [(step, step / 10) for step in range(11)]


def braille_columns(line: str) -> list[int]:
    return [i for i, char in enumerate(line) if "\u2800" <= char <= "\u28ff"]


def test_size_and_axes() -> None:
    lines = render_chart({"train": RISING}, width=60, height=11)
    assert len(lines) == 11
    assert all(len(line) <= 60 for line in lines)
    assert lines[0].startswith("1.00 ┤")
    assert lines[8].startswith("0.00 ┤")
    assert lines[-2].lstrip().startswith("└┬")
    assert lines[-1].split() == ["0", "2", "4", "6", "8", "10"]


def test_a_rising_series_climbs_from_bottom_left_to_top_right() -> None:
    lines = render_chart({"train": RISING}, width=60, height=11)
    top, bottom = braille_columns(lines[0]), braille_columns(lines[8])
    assert top and bottom
    assert min(top) > max(bottom)


def test_later_series_are_markers_on_their_points() -> None:
    lines = render_chart({"train": RISING, "val": [(0, 0.0), (10, 1.0)]}, width=60, height=11)
    assert lines[0].rstrip().endswith("●")
    assert lines[8][lines[8].index("┤") + 1] == "●"
    assert "◆" not in "".join(lines)


@pytest.mark.parametrize(
    ("values", "top", "bottom"),
    [([-1.0, 0.5, 1.0], "1.00", "-1.00"), ([10.0, 35.0, 120.0], "150", "0"), ([3.0, 3.0], "3.50", "2.50")],
)
def test_values_outside_0_1_use_a_round_data_range(values: list[float], top: str, bottom: str) -> None:
    lines = render_chart({"train": list(enumerate(values))}, width=40, height=7)
    assert lines[0].split()[0] == top
    assert lines[4].split()[0] == bottom


def test_empty_nan_and_tiny_inputs_do_not_fail() -> None:
    assert len(render_chart({}, width=30, height=6)) == 6
    nan = render_chart({"train": [(1, math.nan), (2, 0.5), (3, math.inf)]}, width=30, height=6)
    assert any(braille_columns(line) for line in nan)
    tiny = render_chart({"train": RISING, "val": RISING}, width=1, height=1)
    assert len(tiny) == 3
    assert all(len(line) <= 12 for line in tiny)


def test_y_range_fixes_the_axis() -> None:
    lines = render_chart({"train": RISING}, width=40, height=7, y_range=(0.0, 2.0))
    assert lines[0].split()[0] == "2.00"
    assert not braille_columns(lines[0])  # 1.0 is only half way up


def test_more_steps_than_columns_draw_the_column_means() -> None:
    # Alternating 0/1 rewards average to 0.5 in each column: a flat line through the middle row.
    noisy = [(step, float(step % 2)) for step in range(2000)]
    lines = render_chart({"train": noisy}, width=40, height=7)
    assert [i for i, line in enumerate(lines[:5]) if braille_columns(line)] == [2]
