"""Demonstrations -> transitions: supervised data in the same format RL trains on.

A demonstration is a conversation `{"messages": [...], "tools": [...]}` in OpenAI chat form; each
assistant message becomes one transition whose prompt is the chat template of the messages before
it (with the generation prompt) and whose response is what the template adds for that message,
through its end-of-turn token: exactly what the engine would have generated and the proxy recorded.
In `trajectory` mode a conversation is one sequence instead (its assistant turns merged as the
adapter's trajectory mode merges calls, tool results in between masked out): the same targets for
fewer tokens, since no prompt is repeated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from alight import semconv
from alight.adapters.calls import LLMCall
from alight.adapters.retokenize import Retokenizer, retokenize
from alight.adapters.trajectory import merge_trajectories
from alight.errors import ConfigError
from alight.types import Transition


def demonstration_transitions(
    rows: Iterable[Mapping[str, Any]],
    tokenizer: Retokenizer,
    *,
    max_length: int | None = None,
    mode: str = "transition",
) -> tuple[list[Transition], int]:
    """The transitions of every assistant message of every row (reward and advantage 1.0), or with
    `mode="trajectory"` one masked transition per row, and the number of transitions dropped for
    being longer than `max_length` tokens (prompt + response).

    Raises:
        ConfigError: a row without a non-empty `messages` list, or an assistant message the chat
            template cannot render.
    """
    if mode not in ("transition", "trajectory"):
        raise ConfigError(f"demonstration mode must be transition or trajectory, got {mode!r}")
    transitions: list[Transition] = []
    dropped = 0
    for row_index, row in enumerate(rows):
        calls: list[LLMCall] = []
        messages = row.get("messages") if isinstance(row, Mapping) else None
        if not isinstance(messages, list) or not messages:
            raise ConfigError(f"demonstration {row_index}: needs a non-empty 'messages' list")
        tools = row.get("tools") or None
        step = 0
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or message.get("role") != "assistant" or i == 0:
                continue
            ids = retokenize(
                tokenizer,
                {
                    semconv.LLM_REQUEST_MESSAGES: messages[:i],
                    semconv.LLM_REQUEST_TOOLS: tools,
                    semconv.LLM_RESPONSE_MESSAGE: dict(message),
                },
            )
            if ids is None or not ids[0] or not ids[1]:
                raise ConfigError(f"demonstration {row_index}: message {i} cannot be rendered by the chat template")
            calls.append(LLMCall(prompt_ids=ids[0], response_ids=ids[1], logprobs=None, agent_name=None, span_id=None))
        if mode == "trajectory":
            calls = merge_trajectories(calls)[0]
        for call in calls:
            if max_length is not None and len(call.prompt_ids) + len(call.response_ids) > max_length:
                dropped += 1
                continue
            transitions.append(
                Transition.unchecked(
                    list(call.prompt_ids),
                    list(call.response_ids),
                    1.0,
                    f"demo-{row_index}",
                    step_index=step,
                    advantage=1.0,
                    response_mask=None if call.mask is None else list(call.mask),
                )
            )
            step += 1
    return transitions, dropped
