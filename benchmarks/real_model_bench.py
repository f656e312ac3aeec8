"""A real pretrained model trained on a CPU: greedy validation before and after, time and memory.

Runs `alight train` as a user does (a subprocess, `--json`), once per case, on the packaged
SmolLM2-135M-Instruct (`engine.model: smollm2-135m-instruct`), and reads its JSON lines:

  val_reward_start    greedy validation reward at step 0 (after the warm start, if any)
  val_reward_end      greedy validation reward at the last validation
  val_reward_gain     end - start
  val_reward_best     the best greedy validation reward of the run
  wall_s              launch to exit (the model conversion is cached beforehand and not counted)
  first_val_at_s      launch to the end of the step-0 validation (the run's own clock, time_s)
  step_s              median seconds per RL step (rollouts + adaptation + update)
  s_to_target         the run's clock at the end of the first validation at or above --target (calc) or start + --gain
                      (arith); -1 when never reached
  peak_rss_gb         the largest resident set of the run's processes (os.wait4's ru_maxrss)

Cases: `calc` (configs/calc_smol.yaml: tool template + short warm start, then GRPO), `arith`
(configs/arith_smol.yaml: pure RL, no warm start), `arith_lora` (the same with LoRA), and
`calc_verl`/`arith_verl` (the verl backend's real workers on CPU: `trainer.backend=verl`).
Extra Hydra overrides for every case go after `--`.

Usage: python benchmarks/real_model_bench.py [--json] [--cases calc,arith] [--steps N] [-- overrides...]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_report import Row, arguments, emit

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
VAL = "val/reward_mean"
CASES: dict[str, tuple[str, list[str]]] = {
    "calc": ("configs/calc_smol.yaml", []),
    "arith": ("configs/arith_smol.yaml", []),
    "arith_lora": ("configs/arith_smol.yaml", ["algorithm.lora.enabled=true", "algorithm.lr=3e-4"]),
    "calc_verl": ("configs/calc_smol.yaml", ["trainer.backend=verl", "+verl.trainer.device=cpu"]),
    "arith_verl": ("configs/arith_smol.yaml", ["trainer.backend=verl", "+verl.trainer.device=cpu"]),
}


def run_case(config: str, overrides: list[str], run_dir: Path) -> tuple[list[dict[str, Any]], float, float]:
    """`alight train CONFIG --json` in a subprocess: its events, wall seconds and peak RSS (GB)."""
    cmd = [sys.executable, "-m", "alight", "train", config, "--json", "--run-dir", str(run_dir), *overrides]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    started = time.monotonic()
    log = run_dir.parent / f"{run_dir.name}.err"
    with log.open("w") as err:
        child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
        assert child.stdout is not None
        events = []
        for line in child.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.append(event)
            _show(event, time.monotonic() - started)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - started
    if status != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SystemExit(f"alight train {config} failed ({status}): {' | '.join(tail)}")
    return events, wall, usage.ru_maxrss / 1024**2  # kB -> GB


def _show(event: dict[str, Any], elapsed: float) -> None:
    kind = event.get("event")
    if "step" in event and kind is None:  # a step's metrics line
        val = event.get(VAL)
        shown = f", greedy val {val:.3f}" if isinstance(val, (int, float)) else ""
        train = event.get("train/reward_mean")
        shown += f", train {train:.3f}" if isinstance(train, (int, float)) else ""
        print(f"  {elapsed:6.0f} s  step {event['step']}{shown}", file=sys.stderr, flush=True)
    elif kind == "stage" and event.get("done") == 0:
        print(f"  {elapsed:6.0f} s  {event.get('stage')}", file=sys.stderr, flush=True)


def summarise(case: str, events: list[dict[str, Any]], wall: float, rss_gb: float, *, target: float) -> list[Row]:
    """The case's result rows from its events (see the module docstring)."""
    steps = [e for e in events if "step" in e and "event" not in e]
    vals = [(float(e[VAL]), float(e.get("time_s", 0.0))) for e in steps if VAL in e]
    if not vals:
        raise SystemExit(f"{case}: the run reported no validation")
    start, end = vals[0][0], vals[-1][0]
    step_times = [float(e["timing/step_s"]) for e in steps if e["step"] > 0 and "timing/step_s" in e]
    reached = next((at for value, at in vals if value >= target - 1e-9), -1.0)
    rows = {
        "val_reward_start": start,
        "val_reward_end": end,
        "val_reward_gain": end - start,
        "val_reward_best": max(v for v, _ in vals),
        "wall_s": wall,
        "first_val_at_s": vals[0][1],
        "step_s": statistics.median(step_times) if step_times else 0.0,
        "s_to_target": reached,
        "peak_rss_gb": rss_gb,
        "steps": float(len(step_times)),
    }
    return [{"case": case, "metric": metric, "value": round(value, 3)} for metric, value in rows.items()]


def main() -> None:
    parser = arguments(__doc__, cases="calc,arith", repeat=1)
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's)")
    parser.add_argument("--target", type=float, default=0.9, help="calc: the greedy reward to reach")
    parser.add_argument("--gain", type=float, default=0.4, help="arith: the rise over step 0 to reach")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every case (after --)")
    args = parser.parse_args()
    os.chdir(REPO)
    from alight.models.sources import prepare_model

    prepare_model(MODEL)  # converted once, before any timing
    results: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="real-model-bench-") as tmp:
        for case in args.cases.split(","):
            if case not in CASES:
                raise SystemExit(f"unknown case {case!r}; choose from {', '.join(CASES)}")
            config, overrides = CASES[case]
            extra = [f"trainer.steps={args.steps}"] if args.steps else []
            events, wall, rss = run_case(config, [*overrides, *extra, *args.overrides], Path(tmp) / case)
            start = next((float(e[VAL]) for e in events if VAL in e), 0.0)
            target = args.target if case.startswith("calc") else start + args.gain
            results += summarise(case, events, wall, rss, target=target)
    emit("real_model", results, as_json=args.json, title=f"{MODEL} trained on {os.cpu_count()} CPU cores", digits=3)


if __name__ == "__main__":
    main()
