"""A small tool-using agent in plain Python with the stock `openai` client: the quick-start recipe.

It asks the model a question, runs the `add` tool when the model calls it, sends the result back,
and scores the final answer. Nothing in it is alight-specific except the decorator and the base
URL it is handed, so the same function runs unchanged outside alight.
Run it: `alight dev configs/quickstart.yaml --n 4`, then `alight trace RUN_DIR`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai

import alight

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def add(a: int, b: int) -> int:
    return a + b


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]`, calling `add` as the model asks; reward 1.0 for the right number."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages: list[Any] = [
        {"role": "system", "content": "Use the add tool for sums, then answer with the number."},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(3):  # a few turns: tool call(s), then the answer
        reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[ADD_TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            return score(message.content or "", task["answer"])
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = str(add(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as err:  # the model's arguments were not usable
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0


def score(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


def make_questions(n: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """Generated data in the same shape as questions.jsonl: {"question", "answer"}."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"question": f"What is {a} + {b}?", "answer": a + b})
    return rows
