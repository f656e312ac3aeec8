"""Warm-start demonstrations for the AutoGen calculator: calc's, in the form AutoGen sends them.

The AutoGen assistant holds calc's conversation, in AutoGen's wording: the tool schema AutoGen builds
from the `calculate` function (with a title, `additionalProperties` and `strict`), a `name` on the
user's message, no content on a tool-calling assistant message. `demonstrations` takes calc's rows
(`recipes/calc/data.py`, same questions, same tool rate) and rewrites them into that form, the tool
taken from the agent itself, so that the warm start teaches what the agent sends whatever the chat
template renders. Tasks are calc's own generator: `data.train: recipes/calc/data.py:make_problems`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint

_HERE = Path(__file__).resolve().parent
_calc_demonstrations = resolve_entrypoint(f"{_HERE.parent / 'calc' / 'data.py'}:demonstrations", what="calc_autogen")
_calculator_tool = resolve_entrypoint(f"{_HERE / 'agent.py'}:calculator_tool", what="calc_autogen recipe")


def openai_tool() -> dict[str, Any]:
    """The `calculate` tool as AutoGen's OpenAI client sends it."""
    return {"type": "function", "function": dict(_calculator_tool("").schema)}


def autogen_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message of calc's as AutoGen writes it."""
    if message["role"] == "user":
        return {"role": "user", "name": "user", "content": message["content"]}
    if message["role"] == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "tool_calls": message["tool_calls"], "content": None}
    return dict(message)


def demonstrations(n: int = 2000, seed: int = 0, tool_rate: float = 0.35) -> list[dict[str, Any]]:
    """calc's SFT rows `{"messages", "tools"}` (`recipes/calc/data.py:demonstrations`) in AutoGen's form."""
    tools = [openai_tool()]
    return [
        {"messages": [autogen_message(m) for m in row["messages"]], "tools": tools}
        for row in _calc_demonstrations(n, seed, tool_rate)
    ]
