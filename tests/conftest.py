"""Fixtures for every test: the anyio backend, and the real tiny model, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline tiny Qwen2 model (`alight.engines.embedded.tiny_model_dir`) in a temp dir."""
    pytest.importorskip("transformers")
    from alight.engines.embedded import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny")
