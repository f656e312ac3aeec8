"""Calc-X-style word problems for the calculator agent, and SFT demonstrations of its conversation.

Rows have the fields of MU-NLPC/Calc-X: `id`, `question`, `chain` (the calculator trace, in the
dataset's gadget markup), `result` (text, as there) and `source_ds`. Each question hides its
expression in words (`Tom has 47 apples and buys 12 bags of 6 apples...` -> `47+12*6`), with
numbers too large for a tiny model to work out in its head. A question belongs to the train or
the val split by a hash of its text, so the splits never overlap whatever the seeds.

    python recipes/calc/data.py --out data/calc      # writes train.jsonl, val.jsonl, demos.jsonl
Config: `data.train: recipes/calc/data.py:make_problems` (with `generator_kwargs: {split: val}` for val).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint

# The agent's own prompt and tool, loaded the way alight loads the agent (same module object).
_AGENT = Path(__file__).with_name("agent.py")
SYSTEM_PROMPT: str = resolve_entrypoint(f"{_AGENT}:SYSTEM_PROMPT", what="calc recipe")
CALCULATE_TOOL: dict[str, Any] = resolve_entrypoint(f"{_AGENT}:CALCULATE_TOOL", what="calc recipe")
calculate: Callable[[str], str] = resolve_entrypoint(f"{_AGENT}:calculate", what="calc recipe")
SUBMIT: str = resolve_entrypoint(f"{_AGENT}:SUBMIT", what="calc recipe")

SOURCE_DS = "alight_calc"
SPLITS = ("train", "val")
VAL_PERCENT = 20  # share of all possible questions that belong to val

NAMES = ("Tom", "Ana", "Raj", "Mia", "Leo", "Sara")
Problem = tuple[str, str, str]  # (question, expression, formula over the question's numbers a, b, ...)


def _bags(rng: random.Random) -> Problem:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return f"{rng.choice(NAMES)} buys {a} bags of {b} apples. How many apples?", f"{a}*{b}", "a*b"


def _sells(rng: random.Random) -> Problem:
    a, b = rng.randint(200, 999), rng.randint(11, 199)
    return f"A shop had {a} pens and sold {b}. How many are left?", f"{a}-{b}", "a-b"


def _pages(rng: random.Random) -> Problem:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return f"{rng.choice(NAMES)} read {a} pages and then {b} pages. How many pages in all?", f"{a}+{b}", "a+b"


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (_bags, _sells, _pages)


def split_of(question: str) -> str:
    """The split a question belongs to, fixed by a hash of its text."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 100
    return "val" if bucket < VAL_PERCENT else "train"


def make_problems(n: int = 200, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` distinct Calc-X-style rows of `split` ("train" or "val"), the same for the same seed."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _problems(n, random.Random(f"{seed}:{split}"), split)


def _problems(n: int, rng: random.Random, split: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < n:
        question, expression, formula = TEMPLATES[len(rows) % len(TEMPLATES)](rng)
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        rows.append({**_row(question, expression), "formula": formula})
    return rows


def _row(question: str, expression: str) -> dict[str, Any]:
    result = calculate(expression)
    return {
        "id": f"{SOURCE_DS}__{hashlib.sha256(question.encode()).hexdigest()[:12]}",
        "question": question,
        "chain": f'<gadget id="calculator">{expression}</gadget> <output>{result}</output>\n<result>{result}</result>',
        "result": result,
        "source_ds": SOURCE_DS,
    }


def expression_of(row: dict[str, Any]) -> str:
    """The expression in a row's calculator chain."""
    return str(row["chain"]).split('<gadget id="calculator">', 1)[1].split("</gadget>", 1)[0]


def demonstrations(n: int = 2000, seed: int = 0, tool_rate: float = 0.35) -> list[dict[str, Any]]:
    """SFT rows `{"messages", "tools"}` of train problems, exactly the conversation the agent holds.

    With probability `tool_rate` the assistant calls `calculate` with the problem's formula over
    the question's numbers (`a*b`), reads the result and submits it (`Done.`); otherwise it answers
    straight away, "The answer is N." with the right N (a warm start teaches the format, not
    arithmetic a tiny model cannot do). Direct answers being the more common first token, greedy
    decoding answers from the head after the warm start: calling the tool is what RL must learn."""
    # Their own stream of train questions, so GRPO's train rows (seed's "train" stream) are not demonstrated.
    rng = random.Random(f"{seed}:demonstrations")
    rows = []
    for problem in _problems(n, rng, "train"):
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
        messages.append({"role": "user", "content": problem["question"]})
        if rng.random() < tool_rate:
            arguments = json.dumps({"expression": problem["formula"]})
            call = {"id": "call_0", "type": "function", "function": {"name": "calculate", "arguments": arguments}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": "call_0", "content": problem["result"]})
            messages.append({"role": "assistant", "content": SUBMIT})
        else:
            messages.append({"role": "assistant", "content": f"The answer is {problem['result']}."})
        rows.append({"messages": messages, "tools": [CALCULATE_TOOL]})
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Write calc recipe data: train.jsonl, val.jsonl, demos.jsonl.")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-val", type=int, default=200)
    parser.add_argument("--n-demos", type=int, default=2000)
    parser.add_argument("--tool-rate", type=float, default=0.35, help="share of demonstrations that call the tool")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(args.out / "train.jsonl", make_problems(args.n_train, args.seed, "train"))
    _write_jsonl(args.out / "val.jsonl", make_problems(args.n_val, args.seed, "val"))
    _write_jsonl(args.out / "demos.jsonl", demonstrations(args.n_demos, args.seed, args.tool_rate))
    print(f"wrote {args.out}/train.jsonl, val.jsonl, demos.jsonl")


if __name__ == "__main__":
    main()
