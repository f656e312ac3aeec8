"""Fixtures for the engine tests: the real tiny model, built once per session in a temp dir."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from alight.engines.embedded import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("engines") / "tiny")


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[object]:
    """A shared embedded engine on the tiny model (its weights are never changed)."""
    from alight.engines.embedded import EmbeddedEngine

    eng = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=32, batch_wait_ms=5)
    eng.load()
    yield eng
    asyncio.run(eng.close())
