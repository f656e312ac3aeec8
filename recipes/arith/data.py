"""Arithmetic problems for `recipes/arith/agent.py`: `{"id", "question", "answer"}` rows.

Two operands in [`low`, `high`] and an operator, `*` by default ("What is 7 * 8?": the times tables
up to 12, which SmolLM2-135M-Instruct half knows: ~0.4 greedy untrained, room for RL to show a
rise) or `+` ("What is 94 + 91?" with `low=10, high=99`: ~0.1, too rare a success for RL to
start from). Train and val rows come from disjoint halves of the operand pairs (split by a hash
of the pair; `a op b` and `b op a` together), so validation measures problems never trained on.
Run it to write JSONL files: `python recipes/arith/data.py --out DIR`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import random
from pathlib import Path
from typing import Any

SPLITS = ("train", "val")
OPERATORS = {"+": operator.add, "*": operator.mul}


def split_of(a: int, b: int, op: str = "*") -> str:
    """The split an operand pair belongs to (about half each; a op b and b op a together)."""
    low, high = sorted((a, b))
    return "val" if hashlib.sha256(f"{low}{op}{high}".encode()).digest()[0] % 2 else "train"


def make_problems(
    n: int = 200, seed: int = 0, split: str = "train", op: str = "*", low: int = 2, high: int = 12
) -> list[dict[str, Any]]:
    """`n` problems `a op b` of `split`, operands in [`low`, `high`] (deterministic in `seed`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if op not in OPERATORS:
        raise ValueError(f"op must be one of {', '.join(OPERATORS)}, got {op!r}")
    if not 0 <= low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
    rng = random.Random(f"{seed}:{split}:{op}:{low}:{high}")
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if split_of(a, b, op) == split:
            rows.append(
                {"id": f"{split}-{len(rows)}", "question": f"What is {a} {op} {b}?", "answer": OPERATORS[op](a, b)}
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--op", choices=sorted(OPERATORS), default="*")
    parser.add_argument("--low", type=int, default=2)
    parser.add_argument("--high", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows = make_problems(
            args.n if split == "train" else args.n // 10, args.seed, split, args.op, args.low, args.high
        )
        (args.out / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
