"""Time of one training step of the calc recipe, split into rollout, adaptation and update.

Runs `configs/calc.yaml` for real (store, proxy + embedded engine, runner processes, LightningRL,
embedded backend) with a short warm start (--warm-start-steps, so the model already speaks the
tool-call format and the step is representative), then --steps GRPO steps of --batch-size tasks x
--group-size rollouts, and reports per step (median over the steps after the first, which pays for
runner start-up and first calls):

  rollout_s              enqueue -> every rollout of the step ended (agents, proxy, engine)
  adapt_s                proxy flush + spans -> transitions -> advantages -> TransitionBatch
  update_s               backend update (forward, backward, AdamW) + weights served to the engine
  step_s                 the whole step
  update_tokens_per_s    prompt + response tokens through the update / its time
  rollout_tokens_per_s   generated tokens / rollout_s
  rollouts_per_s         rollouts ended / rollout_s

Usage: python benchmarks/train_bench.py [--json] [--steps 6] [--warm-start-steps 300]
       [--batch-size 4] [--group-size 8] [--runners 4]
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
METRICS = {
    "rollout_s": "timing/rollout_s",
    "adapt_s": "timing/adapt_s",
    "update_s": "timing/update_s",
    "step_s": "timing/step_s",
    "update_tokens_per_s": "throughput/update_tokens_per_s",
    "rollout_tokens_per_s": "throughput/tokens_per_s",
    "rollouts_per_s": "throughput/rollouts_per_s",
}


class Steps:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        if metrics.get("step", 0) > 0:
            self.rows.append(metrics)
            print(f"step {metrics['step']}: {metrics['timing/step_s']:.2f} s", file=sys.stderr)

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        if stage == "warm start" and done == total:
            print(f"warm start done ({total} steps, loss {info.get('loss')})", file=sys.stderr)


def main() -> None:
    parser = arguments(__doc__, cases="calc", repeat=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warm-start-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--runners", type=int, default=4)
    args = parser.parse_args()
    os.chdir(REPO)  # the config names the recipe by paths relative to the repository
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"warm_start.steps={args.warm_start_steps}",
            f"trainer.steps={args.steps}",
            f"trainer.batch_size={args.batch_size}",
            f"trainer.group_size={args.group_size}",
            f"runner.n_runners={args.runners}",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "data.val=null",
            "logging.plot=false",
            f"trainer.output_dir={tmp}",
        ]
        cfg = to_object(load_config(REPO / "configs" / "calc.yaml", overrides))
        steps = Steps()
        Trainer(cfg, watchers=[steps]).fit()
    timed = steps.rows[1:] or steps.rows
    results = []
    for metric, key in METRICS.items():
        values = [float(row[key]) for row in timed if row.get(key) is not None]
        digits = 3 if metric.endswith("_s") else 1
        results.append({"case": "calc", "metric": metric, "value": round(statistics.median(values), digits)})
    shape = f"{args.batch_size} tasks x {args.group_size} rollouts, {args.runners} runners"
    title = f"one calc training step ({shape}), median of {len(timed)}"
    emit("train", results, as_json=args.json, title=title, digits=3)


if __name__ == "__main__":
    main()
