"""How much a busy machine slows training: the calc recipe alone, then beside a CPU hog, in one run.

Runs `configs/calc.yaml` for real (a short warm start, then GRPO steps through the store, proxy +
embedded engine and runner processes), once alone and once beside --hogs busy processes, --repeat
times, alternating which goes first. A hog is `while True: pass` (--hog python), or a PyTorch job
of its own, small matrix products on PyTorch's default threads (--hog torch: other training or a
test suite on the same machine, whose OpenMP threads spin as they wait). Reports per case the median of
the repetitions, and the slowdown beside the hog (hog time / alone time, each repetition's pair
measured back to back; the median of those ratios):

  warm_start   steps/s of the supervised warm start (from its progress events, first 10 steps left out)
  grpo_step    seconds per GRPO step (median of the steps after the first, which pays for start-up)

The run's torch thread policy is --torch-threads / --interop-threads (`trainer.torch_threads`,
`trainer.torch_interop_threads`: auto, torch = PyTorch's defaults as before alight chose, or N).
OpenMP reads its wait policy once, when torch is first imported: compare policies in separate runs
of this script, never inside one. The load average before the run is reported as its own row.

Usage: python benchmarks/contention_bench.py [--json] [--repeat 2] [--torch-threads auto]
       [--interop-threads auto] [--warm-start-steps 40] [--steps 3] [--hogs 2] [--hog python|torch]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from alight.config import load_config, to_object
from alight.trainer import Trainer
from bench_report import Row, arguments, emit

REPO = Path(__file__).resolve().parents[1]
SKIP_WARM_START_STEPS = 10  # the first steps pay for lazy initialisation
HOGS = {
    "python": "while True: pass",
    "torch": "import torch\na = torch.rand(96, 96)\nwhile True: a = torch.tanh(a @ a)",
}
#: The hogs' environment: as this script found it (a run sets OMP_WAIT_POLICY for itself and its children).
HOG_ENV = dict(os.environ)


class Timings:
    """Collects the warm start's progress times and the GRPO steps' times of one run."""

    def __init__(self) -> None:
        self.warm_start: list[tuple[int, float]] = []  # (step, monotonic time)
        self.steps: list[float] = []

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        if stage == "warm start" and done >= SKIP_WARM_START_STEPS:
            self.warm_start.append((done, time.monotonic()))

    def on_step(self, metrics: dict[str, Any]) -> None:
        if metrics.get("step", 0) > 0:
            self.steps.append(float(metrics["timing/step_s"]))

    def warm_start_steps_per_s(self) -> float:
        (first, t0), (last, t1) = self.warm_start[0], self.warm_start[-1]
        return (last - first) / (t1 - t0)

    def grpo_step_s(self) -> float:
        return statistics.median(self.steps[1:] or self.steps)


def hog(n: int, kind: str) -> list[subprocess.Popen[bytes]]:
    """`n` busy processes, as other work on a shared machine."""
    return [subprocess.Popen([sys.executable, "-c", HOGS[kind]], env=HOG_ENV) for _ in range(n)]


def train_once(overrides: list[str], hogs: int, kind: str) -> Timings:
    timings = Timings()
    busy = hog(hogs, kind)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = to_object(load_config(REPO / "configs" / "calc.yaml", [*overrides, f"trainer.output_dir={tmp}"]))
            Trainer(cfg, watchers=[timings]).fit()
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return timings


def results(alone: list[Timings], beside: list[Timings]) -> list[Row]:
    rows: list[Row] = []
    measures = (
        ("warm_start", "steps_per_s", Timings.warm_start_steps_per_s, True),
        ("grpo_step", "step_s", Timings.grpo_step_s, False),
    )
    for case, metric, measure, is_rate in measures:
        a, b = [measure(t) for t in alone], [measure(t) for t in beside]
        rows.append({"case": f"{case}_alone", "metric": metric, "value": round(statistics.median(a), 3)})
        rows.append({"case": f"{case}_beside_hog", "metric": metric, "value": round(statistics.median(b), 3)})
        ratios = [x / y if is_rate else y / x for x, y in zip(a, b, strict=True)]  # > 1: slower beside the hog
        print(f"{case}: alone {a}, beside the hog {b}, slowdowns {[round(r, 2) for r in ratios]}", file=sys.stderr)
        rows.append({"case": case, "metric": "slowdown_ratio", "value": round(statistics.median(ratios), 3)})
    return rows


def main() -> None:
    parser = arguments(__doc__, cases="warm_start,grpo_step", repeat=2)
    parser.add_argument("--torch-threads", default="auto")
    parser.add_argument("--interop-threads", default="auto")
    parser.add_argument("--warm-start-steps", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--hog", choices=sorted(HOGS), default="python")
    args = parser.parse_args()
    os.chdir(REPO)  # the config names the recipe by paths relative to the repository
    load = os.getloadavg()[0]
    overrides = [
        f"warm_start.steps={args.warm_start_steps}",
        "warm_start.size=1000",  # enough demonstrations for the steps, generated in a second
        f"trainer.steps={args.steps}",
        "trainer.batch_size=2",
        "trainer.group_size=8",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "data.val=null",
        "logging.plot=false",
        f"trainer.torch_threads={args.torch_threads}",
        f"trainer.torch_interop_threads={args.interop_threads}",
    ]
    alone: list[Timings] = []
    beside: list[Timings] = []
    for rep in range(args.repeat):
        for hogs in (0, args.hogs) if rep % 2 == 0 else (args.hogs, 0):  # alternate: drift hits both alike
            (beside if hogs else alone).append(train_once(overrides, hogs, args.hog))
            print(f"repetition {rep + 1}, {hogs} hogs: done", file=sys.stderr)
    cases = set(args.cases.split(","))
    rows = [
        row for row in results(alone, beside) if row["case"].removesuffix("_alone").removesuffix("_beside_hog") in cases
    ]
    rows.append({"case": "machine", "metric": "load_avg_1m_before", "value": round(load, 2)})
    shape = f"{args.hogs} {args.hog} hogs, torch_threads={args.torch_threads}, {args.repeat} runs"
    title = f"calc training alone and beside {shape}"
    emit("contention", rows, as_json=args.json, title=title, digits=3)


if __name__ == "__main__":
    main()
