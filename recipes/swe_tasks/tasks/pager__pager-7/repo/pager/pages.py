"""Split a list of items into numbered pages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Paginator:
    """Pages of `per_page` items over `items`; pages are numbered from 1."""

    def __init__(self, items: Iterable[Any], per_page: int = 10) -> None:
        if per_page < 1:
            raise ValueError(f"per_page must be at least 1, got {per_page}")
        self.items = list(items)
        self.per_page = per_page

    @property
    def num_pages(self) -> int:
        return len(self.items) // self.per_page

    def page(self, number: int) -> list[Any]:
        """The items on page `number`; IndexError outside 1..num_pages."""
        if number < 1 or number > self.num_pages:
            raise IndexError(f"page {number} out of range 1..{self.num_pages}")
        start = (number - 1) * self.per_page
        return self.items[start : start + self.per_page]
