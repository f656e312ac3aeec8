"""Capture the training dashboard of a short real run as an SVG for the docs (docs/images/dashboard.svg).

    python docs/capture_dashboard.py                      # configs/calc.yaml, a few steps (~5 min on 2 CPUs)
    python docs/capture_dashboard.py --out /tmp/d.svg trainer.steps=2 warm_start.steps=4

The run is `alight train configs/calc.yaml OVERRIDES...` (the same `Trainer`, config and watcher
events), in runs/NAME-docs-capture, removed afterwards. The dashboard is fed the run's events without a live
terminal; its final frame is rendered once into Rich's recording console and exported as SVG.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
from pathlib import Path

from rich.console import Console

from alight.config import load_config, to_object
from alight.dashboard import TrainDashboard
from alight.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OVERRIDES = ("trainer.steps=6", "trainer.val_every=2", "warm_start.steps=120", "data.val_size=16")


def capture(config: Path, overrides: list[str], out: Path, width: int = 110, height: int = 34) -> Path:
    """Run `config` with `overrides` and write the dashboard's last frame to `out` as SVG."""
    view = TrainDashboard(console=Console(file=io.StringIO()))  # never started: no live refresh
    cfg = to_object(load_config(config, overrides))
    run_dir = Path("runs") / f"{cfg.name}-docs-capture"  # relative, as a user's run shows; removed afterwards
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: remove it first")
    try:
        Trainer(cfg, run_dir=run_dir, watchers=[view]).fit()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    frame = Console(record=True, file=io.StringIO(), width=width, height=height, force_terminal=True)
    frame.print(view)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(offline(frame.export_svg(title=f"alight train {config.name}")), encoding="utf-8")
    return out


def offline(svg: str) -> str:
    """Rich's SVG without its web fonts (a CDN): the docs load nothing from the network; a local Fira Code or
    the browser's monospace font draws it."""
    return re.sub(r',\s*url\("https?://[^"]*"\) format\("\w+"\)', "", svg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides (default: {' '.join(DEFAULT_OVERRIDES)})")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "calc.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.svg")
    args = parser.parse_args()
    os.chdir(ROOT)  # the config's paths (recipes/...) and the run directory are relative to the repository
    print(capture(args.config, args.overrides or list(DEFAULT_OVERRIDES), args.out))


if __name__ == "__main__":
    main()
