"""The paper's three agents trained on a real model on this CPU, each rise measured by `alight eval`.

For each case: `alight train CONFIG --json` as a user runs it (the SmolLM2 configs of the recipes),
then `alight eval CONFIG --model RUN/checkpoints/step_000000 --model RUN --split val --n N --json`:
the warm-started step-0 model against the final one on the held-out split, N samples per task at
the config's temperature, the paired bootstrap difference with its 95% interval. Rows per case:

  val_reward_start / _end   greedy validation reward at step 0 and at the last validation (the run's)
  val_reward_best           the best greedy validation of the run
  train_wall_s              `alight train` launch to exit (the model conversion is cached beforehand)
  step_s                    median seconds per RL step
  eval_start / eval_final   mean reward of the step-0 / final model over tasks x N samples (eval)
  eval_diff, _low, _high    final - start, paired bootstrap, and its 95% interval
  eval_wall_s               `alight eval` launch to exit (both models)
  peak_rss_gb               the training run's largest resident set

Cases: `calc_autogen` (configs/calc_autogen_smol.yaml), `spider` (spider_smol.yaml), `rag`
(rag_smol.yaml). With --out DIR each case's metrics.jsonl and eval JSON are copied there as
`<case>_smol_train-<date>.jsonl` and `<case>_smol_eval-<date>.json`.

Usage: python benchmarks/paper_agents_bench.py [--json] [--cases spider,rag] [--n 4] [--out DIR] [-- overrides...]
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_report import Row, arguments, emit
from real_model_bench import MODEL, REPO, run_case, summarise

CASES = {
    "calc_autogen": "configs/calc_autogen_smol.yaml",
    "spider": "configs/spider_smol.yaml",
    "rag": "configs/rag_smol.yaml",
}


def run_eval(config: str, run_dir: Path, n: int, eval_dir: Path) -> tuple[dict[str, Any], float]:
    """`alight eval` of the run's step-0 checkpoint against its newest one: the report and wall seconds."""
    start_model = run_dir / "checkpoints" / "step_000000"
    cmd = [sys.executable, "-m", "alight", "eval", config, "--model", str(start_model), "--model", str(run_dir)]
    cmd += ["--split", "val", "--n", str(n), "--json", "--run-dir", str(eval_dir)]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"alight eval failed ({done.returncode}): {last}")
    return json.loads(done.stdout), wall


def eval_rows(case: str, report: dict[str, Any], wall: float) -> list[Row]:
    """The eval's rows: each model's mean, the paired difference and its interval."""
    start, final = report["models"]
    diff = final["difference"]
    rows = {
        "eval_tasks": report["tasks"],
        "eval_n": report["n"],
        "eval_start": start["mean_reward"]["value"],
        "eval_final": final["mean_reward"]["value"],
        "eval_diff": diff["value"],
        "eval_diff_low": diff["low"],
        "eval_diff_high": diff["high"],
        "eval_wall_s": wall,
    }
    return [{"case": case, "metric": metric, "value": round(float(value), 3)} for metric, value in rows.items()]


def main() -> None:
    parser = arguments(__doc__, cases=",".join(CASES), repeat=1)
    parser.add_argument("--n", type=int, default=4, help="eval samples per task and model")
    parser.add_argument("--out", type=Path, default=None, help="copy each case's metrics and eval JSON here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every training (after --)")
    args = parser.parse_args()
    os.chdir(REPO)
    from alight.models.sources import prepare_model

    prepare_model(MODEL)  # converted once, before any timing
    date = datetime.date.today().isoformat()
    results: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="paper-agents-bench-") as tmp:
        for case in args.cases.split(","):
            if case not in CASES:
                raise SystemExit(f"unknown case {case!r}; choose from {', '.join(CASES)}")
            run_dir = Path(tmp) / case
            events, wall, rss = run_case(CASES[case], list(args.overrides), run_dir)
            rows = summarise(case, events, wall, rss, target=float("inf"))  # no target here: s_to_target left out
            results += [
                {**row, "metric": "train_wall_s"} if row["metric"] == "wall_s" else row
                for row in rows
                if row["metric"] != "s_to_target"
            ]
            report, eval_wall = run_eval(CASES[case], run_dir, args.n, Path(tmp) / f"{case}-eval")
            results += eval_rows(case, report, eval_wall)
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                shutil.copy(run_dir / "metrics.jsonl", args.out / f"{case}_smol_train-{date}.jsonl")
                (args.out / f"{case}_smol_eval-{date}.json").write_text(json.dumps(report, indent=1) + "\n")
    emit("paper_agents", results, as_json=args.json, title=f"{MODEL} on {os.cpu_count()} CPU cores", digits=3)


if __name__ == "__main__":
    main()
