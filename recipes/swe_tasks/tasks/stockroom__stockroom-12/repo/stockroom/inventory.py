"""Stock counts per SKU."""

from __future__ import annotations


class Inventory:
    """How many units of each SKU are in stock."""

    def __init__(self) -> None:
        self._stock: dict[str, int] = {}

    def add(self, sku: str, quantity: int) -> None:
        if quantity <= 0:
            raise ValueError(f"quantity must be positive, got {quantity}")
        self._stock[sku] = self._stock.get(sku, 0) + quantity

    def remove(self, sku: str, quantity: int) -> None:
        if quantity <= 0:
            raise ValueError(f"quantity must be positive, got {quantity}")
        self._stock[sku] = self._stock.get(sku, 0) - quantity
        if self._stock[sku] == 0:
            del self._stock[sku]

    def count(self, sku: str) -> int:
        return self._stock.get(sku, 0)

    def skus(self) -> list[str]:
        return sorted(self._stock)
