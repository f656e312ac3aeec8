"""MetricsLog: durable JSON lines, resume truncation, the reward-curve PNG, missing extras."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from alight.config.schema import LoggingConfig
from alight.errors import ConfigError
from alight.trainer.metrics import MetricsLog

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def log_steps(log: MetricsLog, steps: range) -> None:
    for step in steps:
        metrics: dict[str, float | int] = {"step": step, "train/reward_mean": 0.1 * step}
        if step % 2 == 0:
            metrics["val/reward_mean"] = 0.08 * step
        log.log(metrics)


def test_each_log_is_one_fsynced_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log = MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r")
    log.log({"step": 0, "val/reward_mean": 0.25})
    log.log({"step": 1, "train/reward_mean": 0.5, "actor/kl": math.nan})
    assert len(synced) == 2
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "val/reward_mean": 0.25},
        {"step": 1, "train/reward_mean": 0.5, "actor/kl": None},
    ]
    assert log.rows() == [json.loads(line) for line in lines]
    log.close()


def test_a_killed_process_keeps_every_logged_step(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from alight.config.schema import LoggingConfig\n"
        "from alight.trainer.metrics import MetricsLog\n"
        "log = MetricsLog(Path(sys.argv[1]), LoggingConfig(plot=False), run_name='r')\n"
        "for step in range(3):\n"
        "    log.log({'step': step, 'train/reward_mean': 0.5})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]


def test_resume_truncates_after_the_checkpoint_and_drops_a_torn_line(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r")
    log_steps(log, range(6))
    log.close()
    path = tmp_path / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 6, "train/rew')  # killed mid-write
    resumed = MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r", resume=True)
    assert [row["step"] for row in resumed.rows()] == [0, 1, 2, 3, 4, 5]
    resumed.truncate_after(3)
    assert [row["step"] for row in resumed.rows()] == [0, 1, 2, 3]
    log_steps(resumed, range(4, 6))
    resumed.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4, 5]
    assert not list(tmp_path.glob("*.tmp"))


def test_truncate_after_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "val/reward_mean": 0.1}\n{"step": 1}\n{"step": 2, "tra')
    log = MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r", resume=True)
    log.truncate_after(5)
    assert path.read_text() == '{"step": 0, "val/reward_mean": 0.1}\n{"step": 1}\n'
    log.close()


def test_a_new_run_replaces_an_old_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 9}\n')
    log = MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r")
    log.log({"step": 0})
    assert log.rows() == [{"step": 0}]
    log.close()


def test_close_draws_the_reward_curve(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, LoggingConfig(), run_name="calc-grpo")
    log_steps(log, range(8))
    png = log.close()
    assert png == tmp_path / "reward_curve.png"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_plot_without_rewards_draws_nothing(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, LoggingConfig(), run_name="r")
    log.log({"step": 0, "timing/val_s": 1.0})
    assert log.close() is None
    assert not (tmp_path / "reward_curve.png").exists()


def test_plot_to_another_path(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "run", LoggingConfig(plot=False), run_name="r")
    log_steps(log, range(3))
    target = log.plot(tmp_path / "out" / "curve.png")
    assert target is not None and target.read_bytes().startswith(PNG_SIGNATURE)
    assert log.close() is None  # plot=False: no PNG at close


# A None in sys.modules makes the package look absent (find_spec answers None, import fails): the
# dev extra installs both, and the real TensorBoard and W&B runs are in tests/trainer/test_tracking.py.
def test_tensorboard_without_tensorboard_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r'^logging.tensorboard needs TensorBoard: pip install "alight\[tracking\]"$'):
        MetricsLog(tmp_path, LoggingConfig(tensorboard=True), run_name="r")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_wandb_without_wandb_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r'^logging.wandb needs Weights & Biases: pip install "alight\[tracking\]"$'):
        MetricsLog(tmp_path, LoggingConfig(wandb=True), run_name="r")
