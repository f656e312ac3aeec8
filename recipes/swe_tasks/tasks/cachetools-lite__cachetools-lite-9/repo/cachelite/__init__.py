"""Caches."""

from cachelite.lru import LRUCache

__all__ = ["LRUCache"]
