"""ruff and mypy stay clean, and the package root stays light (STYLE.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the dev extra")
def test_ruff_is_clean() -> None:
    lint = _run("ruff", "check", "src", "tests", "benchmarks")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run("ruff", "format", "--check", "src", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_alight_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, alight, alight.store, alight.cli.app;"
        "heavy = {'torch', 'transformers', 'litellm', 'peft', 'datasets', 'verl', 'vllm', 'ray', 'fastapi',"
        " 'uvicorn', 'httpx', 'opentelemetry'} & {m.split('.')[0] for m in sys.modules};"
        "print(sorted(heavy))"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
