"""`logging.tensorboard` and `logging.wandb` for real, offline: what MetricsLog sends, read back
with each tool's own reader (TensorBoard's EventAccumulator, W&B's `wandb leet inspect`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alight.config.schema import LoggingConfig
from alight.errors import ConfigError
from alight.trainer.metrics import MetricsLog

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")


def log_steps(log: MetricsLog, values: dict[int, float]) -> None:
    for step, value in values.items():
        row: dict[str, Any] = {"step": step, "train/reward_mean": value, "note": "text", "actor/kl": math.nan}
        if step % 2 == 0:
            row["val/reward_mean"] = value / 2
        log.log(row)


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def approx_points(points: dict[int, float]) -> list[tuple[int, Any]]:
    return [(step, pytest.approx(value, rel=1e-6)) for step, value in points.items()]  # stored as float32


def test_tensorboard_event_files_hold_each_steps_scalars(tmp_path: Path) -> None:
    with MetricsLog(tmp_path, LoggingConfig(tensorboard=True, plot=False), run_name="r") as log:
        log_steps(log, {0: 0.0, 1: 0.25, 2: 0.5, 3: 0.75})
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    # Text and NaN (all the actor/kl values) are not scalars: only the numbers arrive.
    assert scalars.keys() == {"train/reward_mean", "val/reward_mean"}
    assert scalars["train/reward_mean"] == approx_points({0: 0.0, 1: 0.25, 2: 0.5, 3: 0.75})
    assert scalars["val/reward_mean"] == approx_points({0: 0.0, 2: 0.25})


def test_tensorboard_draws_the_steps_a_resumed_run_redoes_once(tmp_path: Path) -> None:
    cfg = LoggingConfig(tensorboard=True, plot=False)
    with MetricsLog(tmp_path, cfg, run_name="r") as log:
        log_steps(log, {step: 0.1 * step for step in range(6)})
    with MetricsLog(tmp_path, cfg, run_name="r", resume=True) as resumed:
        resumed.truncate_after(3)  # the checkpoint was at step 3: steps 4 and 5 are done again
        log_steps(resumed, {4: 0.9, 5: 1.0})
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["train/reward_mean"] == approx_points({0: 0.0, 1: 0.1, 2: 0.2, 3: 0.3, 4: 0.9, 5: 1.0})


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B offline with every file it writes under tmp_path: no network, no login, nothing in $HOME."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name, folder in [("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")]:
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / folder))
    monkeypatch.setenv("HOME", str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()  # its settings are process-wide: the next test starts from its own environment


def wandb_records(run_file: Path) -> list[dict[str, Any]]:
    """The records of a run's .wandb transaction log, decoded by W&B's own reader."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(run_file), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def wandb_history(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    return {row["_step"]: {k: v for k, v in row.items() if not k.startswith("_")} for row in rows}


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_offline_run_holds_each_steps_scalars_and_a_resume_continues_its_id(tmp_path: Path) -> None:
    cfg = LoggingConfig(wandb=True, wandb_project="proj", plot=False)
    with MetricsLog(tmp_path, cfg, run_name="calc", config={"algorithm": {"lr": 1e-5}}) as log:
        log_steps(log, {0: 0.0, 1: 0.25, 2: 0.5})
        print("a dashboard frame")  # the terminal is not W&B's to record
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    [first] = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    records = wandb_records(first)
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert (run["project"], run["display_name"], run["run_id"]) == ("proj", "calc", run_id)
    assert run["config"]["update"]["algorithm"] == {"lr": 1e-5}
    assert wandb_history(records) == {
        0: {"train/reward_mean": 0.0, "val/reward_mean": 0.0},
        1: {"train/reward_mean": 0.25},
        2: {"train/reward_mean": 0.5, "val/reward_mean": 0.25},
    }
    assert not [r for r in records if r["type"] in ("output", "output_raw")]

    with MetricsLog(tmp_path, cfg, run_name="calc", config={}, resume=True) as resumed:
        resumed.truncate_after(1)
        log_steps(resumed, {2: 0.75})
    runs = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and all(path.name == f"run-{run_id}.wandb" for path in runs)
    later = wandb_records(runs[1] if runs[0] == first else runs[0])
    assert wandb_history(later) == {2: {"train/reward_mean": 0.75, "val/reward_mean": 0.375}}


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_online_without_an_api_key_is_a_one_line_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_SILENT")
    monkeypatch.setenv("TERM", "dumb")  # W&B would otherwise ask for a key on a terminal
    with pytest.raises(ConfigError) as err:
        MetricsLog(tmp_path, LoggingConfig(wandb=True, plot=False), run_name="r")
    assert str(err.value) == (
        "logging.wandb: No API key configured. Use `wandb login` to log in. (WANDB_MODE=offline keeps the run on disk)"
    )
