"""The optimiser: reads a prompt and its low-reward traces, writes a critique (the "textual
gradient") and candidate edits. `LLMOptimizer` asks any chat model for both; the model is a
`Chat` callable the trainer builds from an engine (litellm reaches any provider or
OpenAI-compatible endpoint, embedded a local model), so this module needs no engine."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from alight.algorithms.apo.parsing import parse_candidates, placeholders

logger = logging.getLogger(__name__)

#: A chat model: OpenAI-style messages in, the assistant's text out.
Chat = Callable[[list[dict[str, str]]], Awaitable[str]]


@dataclass
class Proposal:
    """What the optimiser made of one prompt: its critique, the candidate prompts it wrote (not
    yet checked), and why it made none (the model failed, or its answer held no prompt)."""

    critique: str
    candidates: list[str] = field(default_factory=list)
    error: str | None = None


class Optimizer(Protocol):
    """Anything that proposes `n` edits of `prompt` from the traces of its low-reward rollouts."""

    async def propose(self, prompt: str, traces: Sequence[str], n: int) -> Proposal: ...


CRITIC_SYSTEM = (
    "You improve the prompt of an AI agent. You read the prompt and transcripts of runs that earned a"
    " low reward, and explain concisely what in the prompt led to the failures and how to change it."
)
EDITOR_SYSTEM = (
    "You rewrite the prompt of an AI agent. Apply the critique. Write each new prompt in full between"
    " <prompt> and </prompt>, and nothing else."
)


def critique_messages(prompt: str, traces: Sequence[str]) -> list[dict[str, str]]:
    """The critique request: the prompt, then each trace (already bounded by the caller)."""
    runs = "\n\n".join(f"### Run {i + 1}\n{trace}" for i, trace in enumerate(traces)) or "(no run was recorded)"
    user = (
        f"The agent's prompt:\n<prompt>{prompt}</prompt>\n\nRuns with a low reward:\n{runs}\n\n"
        "What in the prompt made these runs fail, and what should change?"
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]


def edit_messages(prompt: str, critique: str, n: int) -> list[dict[str, str]]:
    """The edit request: the prompt, the critique and the number of prompts to write; the
    placeholders the agent fills are named, since a candidate that drops one is refused."""
    fields = sorted(placeholders(prompt) or ())
    keep = f" Keep the placeholders {', '.join('{' + f + '}' for f in fields)} exactly." if fields else ""
    user = (
        f"The agent's prompt:\n<prompt>{prompt}</prompt>\n\nCritique:\n{critique}\n\n"
        f"Write {n} improved version{'s' if n > 1 else ''} of the prompt.{keep}"
    )
    return [{"role": "system", "content": EDITOR_SYSTEM}, {"role": "user", "content": user}]


class LLMOptimizer:
    """Two calls to `chat` per proposal: the critique, then the edits (parsed by `parse_candidates`).
    A failing call gives a `Proposal` with the error, never an exception."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat

    async def propose(self, prompt: str, traces: Sequence[str], n: int) -> Proposal:
        try:
            critique = (await self.chat(critique_messages(prompt, traces))).strip()
        except Exception as err:  # the optimiser's endpoint, not the run, failed
            logger.warning("APO optimiser: the critique call failed: %s", err)
            return Proposal("", error=f"critique call failed: {type(err).__name__}: {err}")
        try:
            answer = await self.chat(edit_messages(prompt, critique or "(no critique)", n))
        except Exception as err:
            logger.warning("APO optimiser: the edit call failed: %s", err)
            return Proposal(critique, error=f"edit call failed: {type(err).__name__}: {err}")
        candidates = parse_candidates(answer, n)
        return Proposal(critique, candidates, None if candidates else "the answer holds no prompt")
