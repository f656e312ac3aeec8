"""Stock keeping."""

from stockroom.inventory import Inventory

__all__ = ["Inventory"]
