"""Models alight builds itself: the tiny default policy (heavy libraries load only when one is built).

The names load on first use, so importing `alight.models.resolve` (the default model's name, which the
config schema reads) costs the command line's start nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["TINY_SPECIAL_TOKENS", "build_tiny_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from alight.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'alight.models' has no attribute {name!r}")
