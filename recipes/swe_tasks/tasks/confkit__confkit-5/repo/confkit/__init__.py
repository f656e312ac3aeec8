"""Configuration files."""

from confkit.settings import Settings

__all__ = ["Settings"]
