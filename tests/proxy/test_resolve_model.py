"""`alight serve --model PATH`: which weights a path means."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alight.errors import ConfigError
from alight.trainer.serve import resolve_model


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
    assert resolve_model(str(run)) == str(newest)
    assert resolve_model(str(run / "checkpoints")) == str(newest)
    assert resolve_model(str(newest)) == str(newest)
    assert resolve_model("tiny") == "tiny"


def test_paths_without_a_model_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no model at"):
        resolve_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no model"):
        resolve_model(str(tmp_path / "empty"))
