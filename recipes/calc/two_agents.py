"""The calculator agent as a two-agent workflow, for per-agent LoRA (`configs/calc_two_agents.yaml`).

The same conversation as `agent.py`'s `solve`, split between two agents on one model: the
"planner" makes the first call (call `calculate`, or answer at once) and the "answerer" every call
after a tool result (submit the result with `Done.`, a number, or call again). Each call runs
inside `alight.agent_scope(name)`, so the proxy knows which agent calls: with
`algorithm.lora.per_agent` each agent is answered by its own LoRA adapter and trained on its own
calls. Tool, parsing and reward are `agent.py`'s, loaded the way alight loads that agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

import alight
from alight.entrypoints import resolve_entrypoint

_AGENT = Path(__file__).with_name("agent.py")
CALCULATE_TOOL: dict[str, Any] = resolve_entrypoint(f"{_AGENT}:CALCULATE_TOOL", what="calc recipe")
MAX_TURNS: int = resolve_entrypoint(f"{_AGENT}:MAX_TURNS", what="calc recipe")
question_numbers = resolve_entrypoint(f"{_AGENT}:question_numbers", what="calc recipe")
final_answer = resolve_entrypoint(f"{_AGENT}:final_answer", what="calc recipe")
run_tool_call = resolve_entrypoint(f"{_AGENT}:run_tool_call", what="calc recipe")
score = resolve_entrypoint(f"{_AGENT}:score", what="calc recipe")

PLANNER, ANSWERER = "planner", "answerer"


@alight.rollout
def plan_and_answer(task: dict[str, Any], llm: alight.LLM) -> float:
    """The planner's turn, then the answerer's; reward 1.0 for `task["result"]`."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    numbers = question_numbers(task["question"])
    last_result: str | None = None
    for turn in range(MAX_TURNS):
        with alight.agent_scope(PLANNER if turn == 0 else ANSWERER):
            reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATE_TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            return float(score(final_answer(message.content or "", last_result), task["result"]))
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            last_result = run_tool_call(call, numbers)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": last_result})
    return 0.0
