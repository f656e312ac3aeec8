"""Rewrite constraints/cpu.txt: every package the CPU install path resolves, each pinned.

Run it from anywhere with Python 3.11 (it needs PyPI and takes a few minutes):

    python3.11 constraints/refresh.py

It builds a throwaway virtual environment, installs torch (the one pin it starts from), then alight
with the extras below at the newest versions pyproject.toml's ranges allow, checks the result with
`pip check`, and writes what got installed (alight and pip excepted) with a header saying how and
when. Run the tests on the new pins (README's test command) before committing them.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU wheel; any other torch pulls GBs of CUDA (see README)
EXTRAS = "dev,agents,tracking"
# pip comes with the venv and nothing requires it; alight is the project itself.
NOT_PINNED = {"pip", "alight"}
LIST_INSTALLED = (
    "import importlib.metadata as m\nfor d in m.distributions():\n    print(d.metadata['Name'], d.version)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "constraints" / "cpu.txt")
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"run it with Python 3.11 (the CPU path's Python), not {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="alight-pins-") as tmp:
        pins = resolve(Path(tmp))
    pip_version = dict(pins).pop("pip", "?")
    pins = [(name, version) for name, version in pins if normalize(name) not in NOT_PINNED]
    args.output.write_text(header(len(pins), pip_version) + "".join(f"{name}=={version}\n" for name, version in pins))
    print(f"wrote {len(pins)} pins to {args.output}")


def resolve(tmp: Path) -> list[tuple[str, str]]:
    """Install the CPU path into a fresh venv under `tmp`; return every (name, version) there, sorted."""
    venv.create(tmp / "venv", with_pip=True)
    python = str(tmp / "venv" / "bin" / "python")
    seed = tmp / "torch.txt"
    seed.write_text(TORCH + "\n")
    pip = [python, "-m", "pip", "install", "--no-input", "-c", str(seed)]
    run([*pip, TORCH])
    run([*pip, f"{ROOT}[{EXTRAS}]"])
    run([python, "-m", "pip", "check"])
    listed = subprocess.run([python, "-c", LIST_INSTALLED], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in listed.splitlines():
        name, version = line.split()
        # A local label (+cpu) names the build, not the release: `==2.13.0` matches 2.13.0+cpu.
        pins[normalize(name)] = (name, version.split("+")[0])
    return [pins[key] for key in sorted(pins)]


def header(count: int, pip_version: str) -> str:
    python = ".".join(map(str, sys.version_info[:3]))
    return (
        f"# alight's CPU install path, resolved and pinned whole ({count} packages): use it as\n"
        '# `pip install -c constraints/cpu.txt -e ".[dev]"` (README), so pip resolves at once and an\n'
        "# upstream release cannot change what gets installed. pyproject.toml keeps the open ranges.\n"
        f"# Written by `python3.11 constraints/refresh.py` on {datetime.date.today().isoformat()}"
        f" (Python {python}, pip {pip_version}):\n"
        f"# a throwaway venv, `pip install {TORCH}`, then `pip install -c <{TORCH}> .[{EXTRAS}]`,\n"
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
