"""A tool-using agent written with the `anthropic` SDK, trained by alight unchanged.

Two steps, each under its own agent name: the `solver` runs the usual Messages API tool loop (the
model asks for `add`, the agent runs it and sends a `tool_result` back, until the model answers),
then the `writer` streams the final answer (`messages.stream`). The client is pointed at the
attempt's proxy route with `llm.anthropic_base_url` (the proxy serves `POST /v1/messages`); alight
records every call with its token ids, and `adapter.agent_match` picks which agent is trained.
Run it: `alight dev configs/anthropic.yaml --n 4`, then `alight trace RUN_DIR`.
"""

from __future__ import annotations

import re
from typing import Any

import anthropic

import alight

ADD_TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def add(a: int, b: int) -> int:
    return a + b


def run_tool(block: Any) -> dict[str, Any]:
    """A `tool_result` block for the model's `tool_use` block."""
    try:
        content, failed = str(add(**block.input)), False
    except TypeError as err:  # the model's input was not usable
        content, failed = f"error: {err}", True
    return {"type": "tool_result", "tool_use_id": block.id, "content": content, "is_error": failed}


def solve_with_tools(client: anthropic.Anthropic, model: str, max_tokens: int, question: str) -> str:
    """The Messages API tool loop: a few turns of tool use, then the model's own words."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for _ in range(3):
        reply = client.messages.create(
            model=model,
            max_tokens=max_tokens,
            system="Use the add tool for sums, then answer with the number.",
            messages=messages,
            tools=[ADD_TOOL],  # type: ignore[list-item]
        )
        if reply.stop_reason != "tool_use":
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "assistant", "content": reply.content})
        messages.append({"role": "user", "content": [run_tool(b) for b in reply.content if b.type == "tool_use"]})
    return ""


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]`; reward 1.0 when the writer's last number is `task["answer"]`."""
    client = anthropic.Anthropic(base_url=llm.anthropic_base_url, api_key=llm.api_key)
    max_tokens = int(llm.sampling_parameters.get("max_tokens") or 256)  # the Messages API requires it
    with alight.agent_scope("solver"):
        notes = solve_with_tools(client, llm.model, max_tokens, task["question"])
    with alight.agent_scope("writer"):
        prompt = f"{task['question']}\nA colleague's notes: {notes}\nReply with the number only."
        with client.messages.stream(
            model=llm.model, max_tokens=max_tokens, messages=[{"role": "user", "content": prompt}]
        ) as stream:
            answer = "".join(stream.text_stream)
    return score(answer, task["answer"])


def score(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
