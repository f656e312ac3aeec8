"""Fixtures for every test: the anyio backend, and the real tiny model, built once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
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


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train on one torch thread: on a shared 2-core machine a second one only waits (~100x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
