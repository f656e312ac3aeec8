"""The calculator task of recipes/calc/ as a CrewAI crew: one Agent with a calculator tool, a Task per question.

Written the way CrewAI users write a crew: an `Agent` with a role, a goal and a `BaseTool`, on CrewAI's
`LLM` (its native OpenAI provider, which calls the model with the `openai` SDK), a `Task` and a `Crew`.
From alight it takes only the base URL and model it is handed (and the decorator). The task, the
calculator and the reward are calc's (`recipes/calc/agent.py`, loaded from there, not copied): the
model calls `calculate(expression)` and answers with the number, or `Done.` to submit the calculator's
last result. CrewAI adds its own system and task prompts around the question (kept short here: the
role and goal are one word each). After `max_iter` tool-calling turns CrewAI asks once more for a
final answer, without tools: `max_iter=MAX_TURNS - 1` keeps calc's budget of model calls.
Data: calc's generator (`recipes/calc/data.py`); warm start: `recipes/calc_crewai/data.py`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

# CrewAI's anonymous telemetry and trace upload: off before crewai is imported (alight's CrewAI
# instrumentation does the same where unset). Not OTEL_SDK_DISABLED: it would silence alight's tracer.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

try:
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import BaseTool
except ModuleNotFoundError as missing:  # say which install it needs (CrewAI has its own environment)
    raise ModuleNotFoundError(f'{missing}: this recipe needs CrewAI: pip install "alight[crewai]"') from None
from pydantic import BaseModel, Field

import alight
from alight.entrypoints import resolve_entrypoint

# calc's agent, loaded the way alight loads agents (the same module object as its data.py uses).
_CALC = Path(__file__).resolve().parents[1] / "calc" / "agent.py"


def _calc(name: str) -> Any:
    return resolve_entrypoint(f"{_CALC}:{name}", what="calc_crewai recipe")


CALCULATE_TOOL: dict[str, Any] = _calc("CALCULATE_TOOL")  # calc's OpenAI tool: its texts are reused below
MAX_TURNS: int = _calc("MAX_TURNS")
calculate_expression = _calc("calculate")
final_answer = _calc("final_answer")
question_numbers = _calc("question_numbers")
score = _calc("score")

# CrewAI warns on every call that it only estimates token counts for a model it does not know: quiet.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)

AGENT_NAME = "calculator"  # the Agent's role: the agent name on its spans (adapter.agent_match)
GOAL = "answer"
EXPECTED_OUTPUT = "a number"
TOOL_DESCRIPTION: str = CALCULATE_TOOL["function"]["description"]
EXPRESSION_HELP: str = CALCULATE_TOOL["function"]["parameters"]["properties"]["expression"]["description"]


class CalculateInput(BaseModel):
    expression: str = Field(description=EXPRESSION_HELP)


class Calculator(BaseTool):
    """calc's `calculate` for one question: arithmetic over numbers or the question's a, b, c, ..."""

    name: str = "calculate"
    description: str = TOOL_DESCRIPTION
    args_schema: type[BaseModel] = CalculateInput
    numbers: dict[str, float] = Field(default_factory=dict)
    last_result: str | None = None

    def _run(self, expression: str) -> str:
        self.last_result = str(calculate_expression(expression, self.numbers))
        return self.last_result


def crew_for(question: str, llm: alight.LLM) -> tuple[Crew, Calculator]:
    """A one-agent crew answering `question`, and its calculator (which remembers its last result)."""
    calculator = Calculator(numbers=question_numbers(question))
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
    agent = Agent(
        role=AGENT_NAME, goal=GOAL, backstory="", llm=model, tools=[calculator], max_iter=MAX_TURNS - 1, verbose=False
    )
    task = Task(description=question, expected_output=EXPECTED_OUTPUT, agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False), calculator


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]` with a CrewAI crew and its calculator; 1.0 for `task["result"]`."""
    crew, calculator = crew_for(task["question"], llm)
    output = crew.kickoff()
    return float(score(final_answer(output.raw or "", calculator.last_result), task["result"]))
