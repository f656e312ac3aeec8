"""A disk that fills while a checkpoint or the metrics log is written: the run ends with one line
(exit code 1, no traceback), the half-written checkpoint is gone, the previous one is whole and
a run resumes from it, and the metrics file holds whole lines only.

The disk is real: a small tmpfs mounted in a user and mount namespace of the test's own
(`unshare -rm`, as the local sandbox makes them), so nothing but the test sees it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.test_resume_kill import REPO, train_command

UNSHARE = shutil.which("unshare")


def _in_small_disk(folder: Path, size: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run the shell `script` with a tmpfs of `size` mounted on `folder` (seen by it alone)."""
    if UNSHARE is None or subprocess.run([UNSHARE, "-rm", "true"], check=False).returncode != 0:
        pytest.skip("no user namespaces here (unshare -rm)")
    folder.mkdir(parents=True, exist_ok=True)
    mount = f"mount -t tmpfs -o size={size} tmpfs {folder}"
    return subprocess.run(
        [UNSHARE, "-rm", "sh", "-c", f"{mount} && {script}"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_full_disk_while_checkpointing_ends_the_run_in_one_line_and_the_previous_checkpoint_resumes(
    tmp_path: Path,
) -> None:
    from alight.trainer.checkpoint import checkpoints, load_state

    disk, kept = tmp_path / "disk", tmp_path / "kept"
    # the tiny model's base copy (~3.6 MB) and one checkpoint (~3.8 MB) fit in 10 MB; a second one does not
    # (the store lives outside, where its growth cannot decide which write meets the full disk)
    options = ("trainer.steps=3", "trainer.keep_checkpoints=1", f"store.path={tmp_path / 'store.db'}")
    command = " ".join(train_command(disk / "run", *options))
    done = _in_small_disk(disk, "10m", f"{command}; code=$?; cp -a {disk}/run {kept}; exit $code")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[-1].startswith("error: the checkpoint of step 2 could not be written: No space left on device")
    assert lines[-1].endswith("step_000001 is whole: make room, then --resume"), lines[-1]
    assert [step for step, _ in checkpoints(kept)] == [1]
    assert not list((kept / "checkpoints").glob(".tmp-*"))  # the half-written one is gone
    state, _ = load_state(kept / "checkpoints" / "step_000001")
    assert state["step"] == 1
    rows = [json.loads(line) for line in (kept / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]  # step 2 ran; its checkpoint did not fit

    resumed = subprocess.run(
        [*train_command(kept, *options), "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (kept / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]  # step 2 redone once, from step 1's checkpoint
    assert [step for step, _ in checkpoints(kept)] == [3]


METRICS_SCRIPT = """
import sys
from pathlib import Path
from alight.config.schema import LoggingConfig
from alight.errors import TrainingError
from alight.trainer.metrics import MetricsLog

folder = Path(sys.argv[1])
log = MetricsLog(folder, LoggingConfig(), run_name="full")
log.log({"step": 0, "reward": 0.5})
with open(folder / "filler", "wb", buffering=0) as filler:  # the rest of the disk, to the last byte
    try:
        while True:
            filler.write(b"x" * 4096)
    except OSError:
        pass
try:
    log.log({"step": 1, "text": "y" * 100_000})
except TrainingError as err:
    print("error:", err)
log.close()
"""


@pytest.mark.timeout(120)
def test_a_full_disk_while_writing_the_metrics_is_one_line_and_leaves_whole_lines(tmp_path: Path) -> None:
    disk, kept = tmp_path / "disk", tmp_path / "metrics.jsonl"
    script = tmp_path / "fill.py"
    script.write_text(METRICS_SCRIPT)
    done = _in_small_disk(disk, "1m", f"{sys.executable} {script} {disk}; cp {disk}/metrics.jsonl {kept}")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip().startswith("error: the metrics of step 1 could not be written to")
    assert "No space left on device" in done.stdout
    assert [json.loads(line)["step"] for line in kept.read_text().splitlines()] == [0]  # no torn line
