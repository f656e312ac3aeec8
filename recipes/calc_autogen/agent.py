"""The calculator task of recipes/calc/ as an AutoGen AgentChat assistant with a calculator tool.

Written the way AutoGen users write an agent: an `AssistantAgent` on an `OpenAIChatCompletionClient`,
its tool a plain Python function with type annotations. From alight it takes only the base URL and
model it is handed (and the decorator). The task, the calculator and the reward are calc's
(`recipes/calc/agent.py`, loaded from there, not copied), and so is the conversation: no system
message, the question, `calculate(expression)` calls with their results, then the answer (`Done.`
submits the calculator's last result). AutoGen runs model call -> tools up to `max_tool_iterations`
times; an agent whose model never answers in text scores 0, as in calc.
Data: calc's generator (`recipes/calc/data.py`); warm start: `recipes/calc_autogen/data.py`.
"""

from pathlib import Path
from typing import Annotated, Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import alight
from alight.entrypoints import resolve_entrypoint

# calc's agent, loaded the way alight loads agents (the same module object as its data.py uses).
_CALC = Path(__file__).resolve().parents[1] / "calc" / "agent.py"


def _calc(name: str) -> Any:
    return resolve_entrypoint(f"{_CALC}:{name}", what="calc_autogen recipe")


CALCULATE_TOOL: dict[str, Any] = _calc("CALCULATE_TOOL")  # calc's OpenAI tool: its texts are reused below
MAX_TURNS: int = _calc("MAX_TURNS")
calculate_expression = _calc("calculate")
final_answer = _calc("final_answer")
question_numbers = _calc("question_numbers")
score = _calc("score")

AGENT_NAME = "calculator"  # the AssistantAgent's name: the agent name on its spans (adapter.agent_match)
TOOL_DESCRIPTION: str = CALCULATE_TOOL["function"]["description"]
EXPRESSION_HELP: str = CALCULATE_TOOL["function"]["parameters"]["properties"]["expression"]["description"]
# The served model's name means nothing to AutoGen: say what it can do.
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)


def calculator_tool(question: str) -> FunctionTool:
    """The `calculate` tool for one question: arithmetic over numbers or the question's a, b, c, ..."""
    numbers = question_numbers(question)

    def calculate(expression: Annotated[str, EXPRESSION_HELP]) -> str:
        return str(calculate_expression(expression, numbers))

    return FunctionTool(calculate, description=TOOL_DESCRIPTION)


def model_client(llm: alight.LLM) -> OpenAIChatCompletionClient:
    """AutoGen's OpenAI client on the endpoint alight hands the agent."""
    return OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=MODEL_INFO
    )


@alight.rollout
async def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]` with an AutoGen assistant and its calculator; 1.0 for `task["result"]`."""
    client = model_client(llm)
    agent = AssistantAgent(
        AGENT_NAME,
        model_client=client,
        tools=[calculator_tool(task["question"])],
        system_message=None,  # calc's conversation has none (the tool's description carries the rules)
        max_tool_iterations=MAX_TURNS,  # the model answers after its tool calls, as in calc
    )
    try:
        result = await agent.run(task=task["question"])
    finally:
        await client.close()
    last_result = None
    for message in result.messages:
        if isinstance(message, ToolCallExecutionEvent) and message.content:
            last_result = message.content[-1].content
    answer = result.messages[-1]
    if not isinstance(answer, TextMessage) or answer.source != AGENT_NAME:
        return 0.0  # the turns ran out on tool calls: no answer
    return float(score(final_answer(answer.content, last_result), task["result"]))
