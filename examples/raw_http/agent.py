"""An agent with no LLM SDK: it POSTs `{llm.base_url}/chat/completions` itself with `httpx`.

It asks the model a sum, runs the `add` tool when the model calls it, sends the result back and
scores the final answer, as recipes/quickstart/agent.py does with the `openai` client. alight hooks
httpx (and requests, aiohttp, urllib) at the transport level: inside a rollout, each request to the
proxy carries the agent name ("solver"), its parent span and its sequence number, so the LLM spans
nest under the agent and `adapter.agent_match: solver` selects them. No alight call but the decorator.
Run it: `alight dev configs/raw_http.yaml --n 4`, then `alight trace RUN_DIR`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

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


@alight.rollout(name="solver")
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]`, calling `add` as the model asks; reward 1.0 for the right number."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the add tool for sums, then answer with the number."},
        {"role": "user", "content": task["question"]},
    ]
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    with httpx.Client(base_url=llm.base_url, headers=headers, timeout=60) as client:
        for _ in range(3):  # a few turns: tool call(s), then the answer
            body = {"model": llm.model, "messages": messages, "tools": [ADD_TOOL]}
            reply = client.post("/chat/completions", json=body)
            reply.raise_for_status()
            message = reply.json()["choices"][0]["message"]
            if not message.get("tool_calls"):
                return score(message.get("content") or "", task["answer"])
            messages.append(message)
            for call in message["tool_calls"]:
                try:
                    arguments = json.loads(call["function"]["arguments"])
                    result = str(int(arguments["a"]) + int(arguments["b"]))
                except (KeyError, TypeError, ValueError) as err:  # the model's arguments were not usable
                    result = f"error: {err}"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return 0.0


def score(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
