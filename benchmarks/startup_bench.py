"""Start-up cost: `import alight` and `alight --help` in a fresh interpreter.

DESIGN.md keeps both light (heavy dependencies load inside the functions that need them): `import
alight` under 0.1 s and `alight --help` under a second. Cases: `import_alight` (the in-process
import time of the package, from `python -X importtime`, so the interpreter's own start is left
out), `python_bare` (a fresh interpreter doing nothing: the floor) and `alight_help` (the whole
command, interpreter included). Each value is the median of --repeat runs.

Usage: python benchmarks/startup_bench.py [--json] [--repeat 9]
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from bench_report import arguments, emit, median_row

CLI = [sys.executable, "-c", "from alight.cli.app import main; main()", "--help"]


def import_seconds() -> float:
    """The package's cumulative import time as the interpreter measures it (-X importtime)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import alight"], capture_output=True, text=True)
    out.check_returncode()
    line = [row for row in out.stderr.splitlines() if re.search(r"\|\s+alight$", row)][-1]
    return int(line.split("|")[1]) / 1e6


def wall_seconds(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, cwd=Path(__file__).parent)
    return time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__, cases="import_alight,python_bare,alight_help", repeat=9)
    args = parser.parse_args()
    measures = {
        "import_alight": import_seconds,
        "python_bare": lambda: wall_seconds([sys.executable, "-c", "pass"]),
        "alight_help": lambda: wall_seconds(CLI),
    }
    results = []
    for case in args.cases.split(","):
        runs = [measures[case]() * 1000 for _ in range(args.repeat)]
        metric = "import_ms" if case == "import_alight" else "wall_ms"
        results.append(median_row(case, metric, runs, show_runs=not args.json))
    emit("startup", results, as_json=args.json, title=f"median of {args.repeat} runs")


if __name__ == "__main__":
    main()
