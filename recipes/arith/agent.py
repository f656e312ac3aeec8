"""Mental arithmetic, no tools: the model answers "What is 7 * 8?" with the number.

The pure-RL recipe for a real pretrained model (`configs/arith_smol.yaml`): no warm start, no
demonstrations; the only signal is the reward, 1.0 when the last number of the answer is right.
Untrained, SmolLM2-135M-Instruct gets most of its times tables wrong or explains its way past its
token budget; GRPO teaches it to answer briefly and right. Plain `openai` client, one call per task.
"""

from __future__ import annotations

import re
from typing import Any

import openai

import alight

SYSTEM_PROMPT = "Give the answer in one short sentence."


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """Ask `task["question"]`; reward 1.0 when the answer's last number is `task["answer"]`."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}],
    )
    return score(reply.choices[0].message.content or "", task["answer"])


def score(text: str, answer: int) -> float:
    """1.0 when the last integer in `text` (commas between digit groups allowed) equals `answer`."""
    numbers = re.findall(r"-?\d[\d,]*", text)
    if not numbers:
        return 0.0
    try:
        return 1.0 if int(numbers[-1].replace(",", "")) == answer else 0.0
    except ValueError:
        return 0.0
