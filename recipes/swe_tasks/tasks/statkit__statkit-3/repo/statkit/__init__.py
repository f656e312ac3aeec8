"""Descriptive statistics."""

from statkit.stats import mean, median, mode

__all__ = ["mean", "median", "mode"]
