"""A calculator agent in plain Python with the stock `openai` client: the recipe `alight train` learns on.

The model reads a word problem and either answers from its head or calls `calculate(expression)`
with arithmetic composed from the text, reads the result and answers. The expression may use
numbers or the names a, b, c, ... for the question's numbers in order (`a*b` for "buys 12 bags of
63 apples"), and the final answer may be a number or `Done.`, which submits the calculator's last
result. A 0.9M-parameter model cannot learn to copy multi-digit numbers in minutes of training on
a CPU (measured: 0% after 600 SFT steps), so these two conventions leave it the decisions that
matter: whether to call the tool and which arithmetic the words ask for. A real model may write
the numbers and the answer itself; both work. The reward is 1.0 when the answer is the task's
`result`. Nothing in it is alight-specific except the decorator and the base URL it is handed.
Data: `recipes/calc/data.py` (Calc-X-style rows and the SFT demonstrations of this conversation).
"""

from __future__ import annotations

import ast
import functools
import json
import operator
import re
import time
from collections.abc import Callable
from typing import Any

import openai

import alight

# No system prompt: with the tiny model's byte tokenizer every character is a token of every
# prompt; the conventions are in the tool's description, which real models read.
SYSTEM_PROMPT = ""
SUBMIT = "Done."  # a final answer that submits the calculator's last result

CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": (
            "Evaluate arithmetic with + - * / and parentheses. Write numbers, or a, b, c, ... for the"
            " numbers of the question in order. Then answer with the number, or with 'Done.' to submit"
            " the result."
        ),
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47+12*6 or a+b*c"}},
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
    return converse(task, llm, SYSTEM_PROMPT)


@alight.rollout
def solve_with_prompt(task: dict[str, Any], llm: alight.LLM, resources: dict[str, Any]) -> float:
    """`solve` with the system prompt the run publishes as the `prompt` resource (a PromptTemplate
    that APO rewrites; `{question}` in it is filled); no system message while it is empty."""
    prompt = resources.get("prompt")
    system = prompt.format(question=task["question"]) if prompt is not None else SYSTEM_PROMPT
    return converse(task, llm, system)


def converse(task: dict[str, Any], llm: alight.LLM, system_prompt: str, tool_latency_s: float = 0.0) -> float:
    """The conversation of `solve`, after `system_prompt` (none when empty); each tool call takes
    at least `tool_latency_s` seconds (an API's latency, for benchmarks/async_bench.py)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=http_client())
    messages: list[Any] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": task["question"]})
    numbers = question_numbers(task["question"])
    last_result: str | None = None
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATE_TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            return score(final_answer(message.content or "", last_result), task["result"])
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            if tool_latency_s > 0:
                time.sleep(tool_latency_s)
            last_result = run_tool_call(call, numbers)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": last_result})
    return 0.0


@functools.cache
def http_client() -> openai.DefaultHttpxClient:
    """One connection pool for every rollout of this process (OpenAI's advice: reuse clients). An
    `OpenAI` client that makes its own loads the CA certificates each time: ~30 ms of CPU per
    rollout on an idle machine, 55 ms on a loaded one (0.06 ms with this shared client)."""
    return openai.DefaultHttpxClient()


def question_numbers(question: str) -> dict[str, float]:
    """The question's numbers by name, in order: {"a": 12, "b": 63, ...}."""
    values = re.findall(r"\d+(?:\.\d+)?", question)
    return {chr(ord("a") + i): float(v) for i, v in enumerate(values[:26])}


def final_answer(text: str, last_result: str | None) -> str:
    """The answer the agent submits: the model's text, or the calculator's last result when the
    model submits it (`Done.`, or any answer naming no number)."""
    if last_result is not None and not last_result.startswith("error") and not re.search(r"\d", text):
        return last_result
    return text


def run_tool_call(call: Any, numbers: dict[str, float] | None = None) -> str:
    """The tool result for one OpenAI tool call: calculate's answer, or "error: ..." the model can read."""
    if call.function.name != "calculate":
        return f"error: unknown tool {call.function.name!r}"
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        return "error: arguments are not JSON"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return "error: expected {'expression': string}"
    return calculate(arguments["expression"], numbers)


def calculate(expression: str, numbers: dict[str, float] | None = None) -> str:
    """The value of an arithmetic expression (numbers, the names in `numbers`, + - * /, parentheses)
    as text, or "error: ...".

    Parsed with `ast` and evaluated node by node: names, calls, attributes, powers and anything
    else are refused, so no model output ever runs as code. Whole numbers print without ".0"."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        return _format_number(_evaluate(ast.parse(expression.strip(), mode="eval").body, numbers or {}))
    except SyntaxError:
        return "error: not an arithmetic expression"
    except ZeroDivisionError:
        return "error: division by zero"
    except (ValueError, OverflowError, RecursionError) as err:
        return f"error: {err}"


def _evaluate(node: ast.AST, numbers: dict[str, float]) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in numbers:
            raise ValueError(f"the question has no number {node.id!r}")
        return numbers[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left, numbers), _evaluate(node.right, numbers))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, numbers))
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
