"""Fixtures for the engine tests: an embedded engine on the real tiny model (`tiny_dir`: tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[object]:
    """A shared embedded engine on the tiny model (its weights are never changed)."""
    from alight.engines.embedded import EmbeddedEngine

    eng = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=32, batch_wait_ms=5)
    eng.load()
    yield eng
    asyncio.run(eng.close())
