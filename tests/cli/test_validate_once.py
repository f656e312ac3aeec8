"""Every command that runs a config validates it once, before anything starts: `alight train`,
`alight dev` and `alight eval` each call `alight.trainer.checks.validate` exactly one time, and a
setting no part accepts is refused by it in one line (exit 2), whatever the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli.in_process import alight_here


def write_config(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "once.yaml"
    path.write_text(
        f"name: once\ntrainer:\n  output_dir: {tmp_path / 'runs'}\n"
        "agent:\n  entrypoint: tests.fixtures.sample_agents:calculator\n"
        f"data:\n  train: {tmp_path / 'missing.jsonl'}\n  val: {tmp_path / 'missing.jsonl'}\n"
        + "".join(line + "\n" for line in lines)
    )
    return path


COMMANDS = {
    "train": ["train"],
    "dev": ["dev", "--n", "2"],
    "eval": ["eval", "--split", "val"],
    "eval of an endpoint": ["eval", "--split", "val", "--model", "http://127.0.0.1:9/v1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_validates_once_before_anything_starts(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.trainer import checks

    calls: list[dict[str, Any]] = []
    validate = checks.validate

    def counted(cfg: Any, **options: Any) -> Any:
        calls.append(options)
        return validate(cfg, **options)

    monkeypatch.setattr(checks, "validate", counted)
    args = COMMANDS[command]
    done = alight_here(*args[:1], str(write_config(tmp_path)), *args[1:])
    assert done.returncode == 2, done.stderr
    assert "missing.jsonl" in done.stderr  # the data, read after the one validation, is what stops it
    assert len(calls) == 1, calls
    assert calls[0].get("training", True) is (command == "train")
    assert not (tmp_path / "runs").exists()  # nothing started

    calls.clear()
    bad = alight_here(*args[:1], str(write_config(tmp_path, "runner:", "  n_runners: -1")), *args[1:])
    assert bad.returncode == 2 and "runner.n_runners" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert len(calls) == 1
