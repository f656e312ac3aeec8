"""A compact terminal line chart drawn with braille dots: the dashboard's reward curve."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

# Braille dot bit for (row 0-3, column 0-1) inside one character cell (U+2800 + bits).
_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
#: Glyphs of the second, third, ... series (the first is a braille line).
MARKERS = ("●", "◆", "■", "▲")


def render_chart(
    series: Mapping[str, Sequence[tuple[int, float]]],
    width: int,
    height: int,
    *,
    y_range: tuple[float, float] | None = None,
) -> list[str]:
    """Draw `series` (name -> [(step, value)]) as `height` lines of `width` characters.

    The first series is a braille line through its points; each later one puts its marker
    (●, ◆, ■, ▲) on its points. The y axis runs from 0 to 1 when every value lies there, else
    over the data's range (or `y_range`); the x axis spans the smallest to the largest step.
    Non-finite values are skipped. Needs width >= 12 and height >= 3 (smaller is raised to it).
    """
    width, height = max(width, 12), max(height, 3)
    points = [sorted((x, y) for x, y in pts if math.isfinite(y)) for pts in series.values()]
    steps = [x for pts in points for x, _ in pts]
    y0, y1 = y_range or _auto_range([y for pts in points for _, y in pts])
    x0, x1 = (min(steps), max(steps)) if steps else (0, 1)
    x1 = x1 if x1 > x0 else x0 + 1
    rows = height - 2
    labels = _y_labels(y0, y1, rows)
    label_w = max(len(text) for text in labels.values())
    cols = max(2, width - label_w - 2)
    bits = [[0] * cols for _ in range(rows)]
    marks: dict[tuple[int, int], str] = {}

    def pixel(x: float, y: float) -> tuple[int, int]:
        # A value sits at the centre of the row whose label it would carry.
        px = round((x - x0) / (x1 - x0) * (cols * 2 - 1))
        frac = (min(max(y, y0), y1) - y0) / (y1 - y0)
        return px, min(rows * 4 - 1, max(0, round(1.5 + (1 - frac) * (rows - 1) * 4)))

    for i, pts in enumerate(points):
        pixels = [pixel(x, y) for x, y in (_column_means(pts, x0, x1, cols * 2) if i == 0 else pts)]
        if i == 0:
            for a, b in list(itertools.pairwise(pixels)) or [(p, p) for p in pixels]:
                _draw_line(bits, a, b)
        else:
            for px, py in pixels:
                marks[(py // 4, px // 2)] = MARKERS[(i - 1) % len(MARKERS)]
    lines = []
    for r in range(rows):
        cells = "".join(marks.get((r, c)) or (chr(0x2800 + b) if b else " ") for c, b in enumerate(bits[r]))
        lines.append(f"{labels.get(r, ''):>{label_w}} {'┤' if r in labels else '│'}{cells}")
    axis = ["─"] * cols
    tick_line = [" "] * (label_w + 2 + cols)
    last_end = -1
    for col, text in _x_ticks(x0, x1, cols):
        axis[col] = "┬"
        start = min(max(0, label_w + 2 + col - len(text) // 2), len(tick_line) - len(text))
        if start > last_end:
            tick_line[start : start + len(text)] = text
            last_end = start + len(text)
    return [*lines, " " * label_w + " └" + "".join(axis), "".join(tick_line).rstrip()]


def _auto_range(values: list[float]) -> tuple[float, float]:
    if not values or all(0.0 <= v <= 1.0 for v in values):
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    # Round outwards to a multiple of a 1-2-2.5-5 step, so that the labels read as round numbers.
    scale = 10.0 ** math.floor(math.log10((hi - lo) / 4))
    step = next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale * 4 >= hi - lo)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _y_labels(y0: float, y1: float, rows: int) -> dict[int, str]:
    span = y1 - y0
    decimals = max(0, min(4, 2 - math.floor(math.log10(span)))) if span > 0 else 2
    # Prefer 5, 4 or 3 evenly spaced labels, so that they read as round values.
    n = min(rows, next((n for n in (5, 4, 3) if (rows - 1) % (n - 1) == 0), 5))
    picked = {round(k * (rows - 1) / (n - 1)) for k in range(n)} if n > 1 else {0}
    return {r: f"{y1 - r / max(rows - 1, 1) * span:.{decimals}f}" for r in sorted(picked)}


def _x_ticks(x0: float, x1: float, cols: int) -> list[tuple[int, str]]:
    span, most = x1 - x0, max(2, cols // 8)
    step = 1.0
    while span / step > most:
        step *= 2.5 if str(step)[0] == "2" else 2.0  # 1, 2, 5, 10, 20, 50, ...
    first = math.ceil(x0 / step) * step
    values = [first + k * step for k in range(int((x1 - first) // step) + 1)]
    return [(round((v - x0) / span * (cols * 2 - 1)) // 2, f"{v:g}") for v in values]


def _column_means(pts: list[tuple[int, float]], x0: float, x1: float, width: int) -> list[tuple[float, float]]:
    # More steps than dot columns: one point per column, the mean of its steps (cost stays per column).
    if len(pts) <= width:
        return [(float(x), y) for x, y in pts]
    columns: dict[int, list[tuple[int, float]]] = {}
    for x, y in pts:
        columns.setdefault(round((x - x0) / (x1 - x0) * (width - 1)), []).append((x, y))
    return [(sum(x for x, _ in c) / len(c), sum(y for _, y in c) / len(c)) for c in columns.values()]


def _draw_line(bits: list[list[int]], a: tuple[int, int], b: tuple[int, int]) -> None:
    (ax, ay), (bx, by) = a, b
    n = max(abs(bx - ax), abs(by - ay), 1)
    for t in range(n + 1):
        px, py = ax + round((bx - ax) * t / n), ay + round((by - ay) * t / n)
        bits[py // 4][px // 2] |= _DOT_BITS[py % 4][px % 2]
