"""How the suite runs in parallel (tests/conftest.py): on an xdist worker the Ray group comes first,
then the `slow` tests; a serial run keeps the collection order and collects without xdist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("tests/test_cli.py", "tests/test_code_quality.py", "tests/trainer/test_ray_parity.py")


def _collected(worker: str | None) -> list[str]:
    """The node ids `pytest --collect-only -p no:xdist` lists for FILES, as worker `worker` or serially."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    if worker is not None:
        env["PYTEST_XDIST_WORKER"] = worker
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *FILES]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # e.g. the xdist_group marker unknown
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_a_worker_starts_with_the_ray_group_then_the_slow_tests() -> None:
    ids = _collected("gw0")
    assert ids[0] == "tests/trainer/test_ray_parity.py::test_the_ray_pool_learns_as_the_local_pool_does"
    assert ids[1] == "tests/test_code_quality.py::test_mypy_is_clean"  # the one slow test of the rest
    assert ids[2] == "tests/test_cli.py::test_help_and_version"  # then the collection order
    assert sorted(ids) == sorted(set(_collected(None)))  # the same tests as a serial run's, each once


def test_a_serial_run_keeps_the_collection_order() -> None:
    ids = _collected(None)
    assert ids[0] == "tests/test_cli.py::test_help_and_version"
    assert ids[-1] == "tests/trainer/test_ray_parity.py::test_the_ray_pool_learns_as_the_local_pool_does"
