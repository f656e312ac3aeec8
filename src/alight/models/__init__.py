"""Models alight builds itself: the tiny default policy (heavy libraries load only when one is built)."""

from __future__ import annotations

from alight.models.tiny import TINY_SPECIAL_TOKENS, build_tiny_model

__all__ = ["TINY_SPECIAL_TOKENS", "build_tiny_model"]
