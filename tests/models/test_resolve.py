"""The one model resolver: which weights a spec means (`alight serve --model PATH`, a run's
starting weights, an engine's model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alight.errors import ConfigError
from alight.models.resolve import TINY, resolve_model
from alight.models.tiny import is_current_tiny_model


def model_dir(path: Path, mtime: float) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    os.utime(path / "config.json", (mtime, mtime))
    return path


def test_a_run_directory_serves_its_newest_checkpoint_not_its_base_model(tmp_path: Path) -> None:
    run = tmp_path / "calc-run"
    model_dir(run / "base_model", 3_000)
    model_dir(run / "checkpoints" / "step_000005", 1_000)
    newest = model_dir(run / "checkpoints" / "step_000010", 2_000)
    assert resolve_model(str(run), checkpoints=True) == newest
    assert resolve_model(str(run / "checkpoints"), checkpoints=True) == newest
    assert resolve_model(str(newest), checkpoints=True) == newest
    with pytest.raises(ConfigError, match="holds no model"):  # a run directory is not a model but to serve
        resolve_model(str(run))


def test_the_tiny_model_is_built_once_where_asked_with_the_seed_and_told(tmp_path: Path) -> None:
    told: list[str] = []
    first = resolve_model(TINY, tiny_dir=tmp_path / "a", seed=1, progress=told.append)
    assert first == tmp_path / "a" and is_current_tiny_model(first) and told == ["building the model"]
    assert resolve_model(TINY, tiny_dir=tmp_path / "a", seed=1, progress=told.append) == first
    assert told == ["building the model"]  # built already: nothing to tell
    other = resolve_model(TINY, tiny_dir=tmp_path / "b", seed=2)
    weights = [(path / "model.safetensors").read_bytes() for path in (first, other)]
    assert weights[0] != weights[1]


def test_paths_without_a_model_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no model at"):
        resolve_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no model"):
        resolve_model(str(tmp_path / "empty"), checkpoints=True)
