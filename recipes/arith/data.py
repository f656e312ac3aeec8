"""Addition problems for `recipes/arith/agent.py`: `{"id", "question", "answer"}` rows.

Operands have `digits` digits (two by default: "What is 94 + 91?"). Train and val rows come from
disjoint halves of the operand pairs (split by a hash of the pair), so validation measures
problems never trained on. Run it to write JSONL files: `python recipes/arith/data.py --out DIR`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

SPLITS = ("train", "val")


def split_of(a: int, b: int) -> str:
    """The split an operand pair belongs to (about half each; a + b and b + a together)."""
    low, high = sorted((a, b))
    return "val" if hashlib.sha256(f"{low}+{high}".encode()).digest()[0] % 2 else "train"


def make_problems(n: int = 200, seed: int = 0, split: str = "train", digits: int = 2) -> list[dict[str, Any]]:
    """`n` addition problems of `split` with `digits`-digit operands (deterministic in `seed`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    rng = random.Random(f"{seed}:{split}:{digits}")
    low, high = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if split_of(a, b) == split:
            rows.append({"id": f"{split}-{len(rows)}", "question": f"What is {a} + {b}?", "answer": a + b})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows = make_problems(args.n if split == "train" else args.n // 10, args.seed, split, args.digits)
        (args.out / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
