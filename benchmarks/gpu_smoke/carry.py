"""Carry the GPU smoke check to a machine whose image already holds PyTorch (CUDA), in uploads of
at most --limit-mib each: the way the first H100 run (2026-11-26) went, written down.

`prepare.py` carries every wheel and installs them with pip on the GPU machine (~1 GB). A machine
whose image already has torch, transformers' dependencies, pandas, pyarrow, aiohttp and the like
needs far less: this script carries only the distributions such an image lacks (`carry_stack.txt`,
versions from constraints/cpu.txt), already installed for Python 3.12 into one folder (`pip
install --target`, Ray's Java jars and RLlib left out), as one xz archive, plus SmolLM2's GGUF (xz),
cut into parts and spread over call folders `call1`, `call2`, ... of at most the limit each.
`device.sh`, copied into every call folder, gathers the parts on the GPU machine; once all are
there it checks every sha256 (bundle.py's manifest), unpacks, and runs `run.py --skip-install`
from the checkout it is run in (configs/ and recipes/ come from there).

Usage: python benchmarks/gpu_smoke/carry.py OUT_DIR [--limit-mib 56] [--dry-run]
then, on the GPU machine, from the checkout, for each call folder in turn: bash callN/device.sh
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bundle import MANIFEST, split_folder  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from prepare import SDIST_ONLY, pip, target_args  # noqa: E402

#: Left out of the site: Ray's Java jars and RLlib (33 and 8 MB; never imported by verl or alight).
TRIM = ("ray/jars", "ray/rllib")
SITE, MODEL = "site.tar.xz", "smollm2.gguf.xz"


def stack() -> list[str]:
    """`name==version` of each distribution in carry_stack.txt, pinned by constraints/cpu.txt."""
    pins = {}
    for line in (ROOT / "constraints" / "cpu.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[normalise(name)] = version.strip()
    wanted = [line.split("#")[0].strip() for line in (HERE / "carry_stack.txt").read_text().splitlines()]
    missing = [name for name in wanted if name and normalise(name) not in pins]
    if missing:
        raise SystemExit(f"carry: constraints/cpu.txt pins no {', '.join(missing)}")
    return [f"{name}=={pins[normalise(name)]}" for name in wanted if name]


def normalise(name: str) -> str:
    return str(canonicalize_name(name))  # PEP 503, as pip compares names


def build_site(work: Path) -> Path:
    """The stack installed for Python 3.12 into one folder (no dependencies resolved: the list is whole)."""
    wheels, site = work / "wheels", work / "site"
    pins = [pin for pin in stack() if not any(pin.startswith(s.split("==")[0]) for s in SDIST_ONLY)]
    run_pip("download", "--no-deps", "-d", str(wheels), *target_args(), *pins)
    run_pip("wheel", "--no-deps", "-w", str(wheels), str(ROOT), *SDIST_ONLY)
    run_pip("install", "--no-deps", "--no-compile", "--target", str(site), *target_args(), *found(wheels))
    for part in TRIM:
        shutil.rmtree(site / part, ignore_errors=True)
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return site


def run_pip(*args: str) -> None:
    done = pip(*args, timeout_s=3600)
    if done.returncode != 0:
        raise SystemExit(f"carry: pip {args[0]} failed: {done.stderr.strip()[-1500:]}")


def found(wheels: Path) -> list[str]:
    return sorted(str(path) for path in wheels.glob("*.whl"))


def xz_tar(folder: Path, out: Path) -> None:
    """`folder`'s contents as a .tar.xz: with xz on every core when the machine has it (Python's
    lzma uses one: 5x slower on the 356 MB site)."""
    if shutil.which("tar") and shutil.which("xz"):
        subprocess.run(["tar", "-cf", str(out), "-I", "xz -6 -T0", "-C", str(folder), "."], check=True)
        return
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)


def xz_file(path: Path, out: Path) -> None:
    with path.open("rb") as src, lzma.open(out, "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def spread(stage: Path, out: Path, limit: int) -> list[list[str]]:
    """Move the files of `stage` (each at most `limit`) into call folders of at most `limit` bytes
    in all (largest first, each into the first folder it fits); the manifest, device.sh, bundle.py
    and run.py go into every folder. Returns the file names of each call."""
    files = sorted((p for p in stage.iterdir() if p.name != MANIFEST), key=lambda p: -p.stat().st_size)
    helpers = (stage / MANIFEST, HERE / "device.sh", HERE / "bundle.py", HERE / "run.py")
    extra = sum(helper.stat().st_size for helper in helpers)
    calls: list[list[Path]] = []
    for path in files:
        size = path.stat().st_size
        if size + extra > limit:
            raise SystemExit(f"carry: {path.name} ({size} bytes) does not fit a call of {limit} bytes")
        home = next((c for c in calls if sum(p.stat().st_size for p in c) + size + extra <= limit), None)
        if home is None:
            calls.append(home := [])
        home.append(path)
    for index, members in enumerate(calls, 1):
        folder = out / f"call{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for path in members:
            shutil.move(str(path), folder / path.name)
        for helper in helpers:
            shutil.copy2(helper, folder / helper.name)
    return [[p.name for p in members] for members in calls]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder of call folders to write")
    parser.add_argument("--limit-mib", type=float, default=56.0, help="most MiB one call may carry")
    parser.add_argument("--dry-run", action="store_true", help="print the pinned distributions only")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(json.dumps({"python": "3.12", "carry": stack(), "trim": list(TRIM)}, indent=1))
        return 0
    limit = int(args.limit_mib * (1 << 20))
    if limit < 4 << 20:
        parser.error("--limit-mib must be at least 4")
    from alight.models.sources import packaged_gguf

    with tempfile.TemporaryDirectory(prefix="alight-carry-") as tmp:
        work = Path(tmp)
        stage = work / "stage"
        stage.mkdir()
        print("carry: installing the stack for Python 3.12 (a few minutes)", file=sys.stderr)
        xz_tar(build_site(work), stage / SITE)
        print("carry: compressing the model", file=sys.stderr)
        xz_file(packaged_gguf("smollm2-135m-instruct"), stage / MODEL)
        # parts small enough that the manifest and the scripts fit beside one in a call
        split_folder(stage, limit=limit - (1 << 20))
        calls = spread(stage, args.out, limit)
    sizes = [sum((args.out / f"call{i}" / n).stat().st_size for n in names) for i, names in enumerate(calls, 1)]
    print(json.dumps({"calls": len(calls), "mib": [round(s / (1 << 20), 1) for s in sizes]}))
    for index in range(1, len(calls) + 1):
        print(f"  call {index}: carry {args.out.name}/call{index}; run: bash {args.out.name}/call{index}/device.sh")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
