"""Warm-start demonstrations for the CrewAI calculator: calc's, in the form CrewAI sends them.

The crew holds calc's conversation in CrewAI's wording: its system prompt from the agent's role and
goal, the question inside its task prompt (with the task's expected output), the tool schema CrewAI
builds from the `Calculator` tool (`strict`, `additionalProperties`), no content on a tool-calling
assistant message and the tool's name on its result. `demonstrations` takes calc's rows
(`recipes/calc/data.py`, same questions, same tool rate) and rewrites them into that form, so that the
warm start teaches what the crew sends whatever the chat template renders (the recipe's test checks
these against what CrewAI really sends). Tasks: `data.train: recipes/calc/data.py:make_problems`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint

_HERE = Path(__file__).resolve().parent
_calc_demonstrations = resolve_entrypoint(f"{_HERE.parent / 'calc' / 'data.py'}:demonstrations", what="calc_crewai")
_agent = f"{_HERE / 'agent.py'}"
AGENT_NAME: str = resolve_entrypoint(f"{_agent}:AGENT_NAME", what="calc_crewai recipe")
GOAL: str = resolve_entrypoint(f"{_agent}:GOAL", what="calc_crewai recipe")
EXPECTED_OUTPUT: str = resolve_entrypoint(f"{_agent}:EXPECTED_OUTPUT", what="calc_crewai recipe")
TOOL_DESCRIPTION: str = resolve_entrypoint(f"{_agent}:TOOL_DESCRIPTION", what="calc_crewai recipe")
EXPRESSION_HELP: str = resolve_entrypoint(f"{_agent}:EXPRESSION_HELP", what="calc_crewai recipe")


def openai_tool() -> dict[str, Any]:
    """The `calculate` tool as CrewAI's OpenAI provider sends it."""
    parameters = {
        "properties": {"expression": {"description": EXPRESSION_HELP, "type": "string"}},
        "required": ["expression"],
        "type": "object",
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": "calculate", "description": TOOL_DESCRIPTION, "strict": True, "parameters": parameters},
    }


def system_message() -> dict[str, Any]:
    """CrewAI's system prompt for the calculator agent (role, empty backstory, goal)."""
    return {"role": "system", "content": f"You are {AGENT_NAME}. \nYour personal goal is: {GOAL}"}


def task_prompt(question: str) -> str:
    """CrewAI's user prompt for a task whose description is `question`."""
    return (
        f"\nCurrent Task: {question}\n\nThis is the expected criteria for your final answer: {EXPECTED_OUTPUT}\n"
        "you MUST return the actual complete content as the final answer, not a summary."
    )


def crewai_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message of calc's as CrewAI writes it."""
    if message["role"] == "user":
        return {"role": "user", "content": task_prompt(message["content"])}
    if message["role"] == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    if message["role"] == "tool":
        return {
            "role": "tool",
            "tool_call_id": message["tool_call_id"],
            "name": "calculate",
            "content": message["content"],
        }
    return dict(message)


def demonstrations(n: int = 2000, seed: int = 0, tool_rate: float = 0.35) -> list[dict[str, Any]]:
    """calc's SFT rows `{"messages", "tools"}` (`recipes/calc/data.py:demonstrations`) in CrewAI's form."""
    tools = [openai_tool()]
    return [
        {"messages": [system_message(), *(crewai_message(m) for m in row["messages"])], "tools": tools}
        for row in _calc_demonstrations(n, seed, tool_rate)
    ]
