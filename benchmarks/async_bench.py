"""Synchronous and asynchronous training side by side: the calc recipe with a calculator that
answers like a remote API (each tool call takes --latency seconds, default 0.5).

Runs `configs/calc.yaml` for real twice in one process, the same seed and data (store, proxy +
embedded engine, runner processes, LightningRL, embedded backend): `trainer.mode=sync`, then
`trainer.mode=async` with `trainer.max_staleness=--staleness`, from the same warm-started weights
(the first run's warm start). Reports for each mode:

  steps_per_min        RL steps per minute, from the end of step 1 to the end of the last step
                       (the first step pays for runner start-up; validation is left out: it runs
                       only at step 0 and the last step, after the clock stops)
  utilisation          share of the runners' wall time spent on rollouts (median over the steps)
  val_reward_start     greedy validation reward before any update
  val_reward_end       ... after the last step
  rollout_s, update_s  median per step: waiting for the step's rollouts (async: for complete
                       groups), and the update + serving the new weights
  stale_groups         (async) trained groups served by older weights; dropped_groups: over the bound

and `async_speedup_ratio`: async steps_per_min / sync steps_per_min (target: at least 1.6).

Usage: python benchmarks/async_bench.py [--json] [--steps 20] [--latency 0.5] [--staleness 1]
       [--runners 4] [--modes sync,async]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from alight.config import load_config, to_object
from alight.trainer import Trainer
from bench_report import arguments, emit

REPO = Path(__file__).resolve().parents[1]


class Steps:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.rows: list[dict[str, Any]] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        self.rows.append(metrics)
        if metrics.get("step", 0) > 0:
            shown = f"{metrics['timing/step_s']:.2f} s, utilisation {metrics.get('runners/utilisation', 0):.2f}"
            print(f"{self.mode} step {metrics['step']}: {shown}", file=sys.stderr)

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        if stage == "warm start" and done == total:
            print(f"{self.mode}: warm start done ({total} steps, loss {info.get('loss')})", file=sys.stderr)


def run(mode: str, args: Any, tmp: str, warm: Path | None) -> tuple[dict[str, float], Path]:
    """One run of `mode`; from `warm` (a warm-started checkpoint) when given, else with the
    config's warm start. Returns its figures and its step-0 checkpoint."""
    overrides = [
        "agent.entrypoint=benchmarks/async_agent.py:solve",
        f"trainer.steps={args.steps}",
        f"runner.n_runners={args.runners}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "logging.plot=false",
        f"trainer.mode={mode}",
        f"trainer.max_staleness={args.staleness}",
        f"trainer.output_dir={tmp}/{mode}",
        *([f"engine.model={warm}", "warm_start.steps=0"] if warm is not None else []),
    ]
    cfg = to_object(load_config(REPO / "configs" / "calc.yaml", overrides))
    steps = Steps(mode)
    result = Trainer(cfg, watchers=[steps]).fit()
    rows = [r for r in steps.rows if r.get("step", 0) > 0]
    # time_s is recorded after each step (and, at the last step, after its validation): time the
    # steps 2..N by the clock at the end of step 1 and at the end of step N's update.
    first, last = rows[0], rows[-1]
    span = last["time_s"] - first["time_s"] - float(last.get("timing/val_s", 0.0))
    out = {
        "steps_per_min": 60.0 * (len(rows) - 1) / span if span > 0 else 0.0,
        "utilisation": statistics.median(float(r.get("runners/utilisation", 0.0)) for r in rows[1:] or rows),
        "val_reward_start": float(result.val_reward_start or 0.0),
        "val_reward_end": float(result.val_reward_end or 0.0),
        "rollout_s": statistics.median(float(r["timing/rollout_s"]) for r in rows[1:] or rows),
        "update_s": statistics.median(float(r["timing/update_s"]) for r in rows[1:] or rows),
    }
    if mode == "async":
        out["stale_groups"] = float(sum(r.get("async/groups", 0) - r.get("async/staleness_0", 0) for r in rows))
        out["dropped_groups"] = float(last.get("async/dropped_total", 0))
    return out, result.run_dir / "checkpoints" / "step_000000"


def main() -> None:
    parser = arguments(__doc__, cases="sync,async", repeat=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds each tool call takes")
    parser.add_argument("--staleness", type=int, default=1, help="trainer.max_staleness of the async run")
    parser.add_argument("--runners", type=int, default=4)
    args = parser.parse_args()
    os.chdir(REPO)  # the config names the recipe by paths relative to the repository
    os.environ["ALIGHT_BENCH_TOOL_LATENCY_S"] = str(args.latency)  # the runner processes inherit it
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    modes = [m for m in args.cases.split(",") if m]
    measured: dict[str, dict[str, float]] = {}
    warm: Path | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:  # the first run warm-starts; the others start from its warm start
            measured[mode], start = run(mode, args, tmp, warm)
            warm = warm or start
    results = [
        {"case": mode, "metric": metric, "value": round(value, 3)}
        for mode, values in measured.items()
        for metric, value in values.items()
    ]
    if "sync" in measured and "async" in measured and measured["sync"]["steps_per_min"] > 0:
        ratio = measured["async"]["steps_per_min"] / measured["sync"]["steps_per_min"]
        results.append({"case": "async/sync", "metric": "async_speedup_ratio", "value": round(ratio, 3)})
    title = f"calc, {args.steps} steps, tool latency {args.latency:g} s, {args.runners} runners"
    title += f", async max_staleness {args.staleness}"
    emit("async", results, as_json=args.json, title=title, digits=3)


if __name__ == "__main__":
    main()
