"""A calculator agent in plain Python with the stock `openai` client: the recipe `alight train` learns on.

The model reads a word problem, may call `calculate(expression)` with the arithmetic it composed
from the text, reads the result and answers with a number. The reward is 1.0 when the last number
of the final answer is the task's `result`. Nothing in it is alight-specific except the decorator
and the base URL it is handed, so the same function runs unchanged outside alight.
Data: `recipes/calc/data.py` (Calc-X-style rows and the SFT demonstrations of this conversation).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from typing import Any

import openai

import alight

# Short on purpose: with the tiny model's byte tokenizer every character is a token of every prompt.
SYSTEM_PROMPT = "Answer with a number. Use calculate for arithmetic."

CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47+12*6"}},
            "required": ["expression"],
        },
    },
}

MAX_TURNS = 3  # model calls per task: tool call(s), then the answer
MAX_EXPRESSION_CHARS = 200  # longer input is refused before parsing (deep nesting could exhaust the stack)

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]`, running `calculate` as the model asks; reward 1.0 for `task["result"]`."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATE_TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            return score(message.content or "", task["result"])
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool_call(call)})
    return 0.0


def run_tool_call(call: Any) -> str:
    """The tool result for one OpenAI tool call: calculate's answer, or "error: ..." the model can read."""
    if call.function.name != "calculate":
        return f"error: unknown tool {call.function.name!r}"
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        return "error: arguments are not JSON"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return "error: expected {'expression': string}"
    return calculate(arguments["expression"])


def calculate(expression: str) -> str:
    """The value of an arithmetic expression (numbers, + - * /, parentheses) as text, or "error: ...".

    Parsed with `ast` and evaluated node by node: names, calls, attributes, powers and anything
    else are refused, so no model output ever runs as code. Whole numbers print without ".0"."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        return _format_number(_evaluate(ast.parse(expression.strip(), mode="eval").body))
    except SyntaxError:
        return "error: not an arithmetic expression"
    except ZeroDivisionError:
        return "error: division by zero"
    except (ValueError, OverflowError, RecursionError) as err:
        return f"error: {err}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported {type(node).__name__} in expression")


def _format_number(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        raise OverflowError("result is not a finite number")
    if value == int(value):
        return str(int(value))
    return f"{value:.6g}"


def score(text: str, result: str | float) -> float:
    """1.0 when the last number in `text` equals `result` ("119", "119.0", "The answer is 119"), else 0.0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", re.sub(r"(?<=\d)[,_](?=\d{3})", "", text))
    if not numbers:
        return 0.0
    expected = float(str(result).replace(",", ""))  # Calc-X writes results as text, e.g. "3_750"
    return 1.0 if abs(float(numbers[-1]) - expected) < 1e-6 else 0.0
