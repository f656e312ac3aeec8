"""Demonstrations -> transitions: supervised data in the same format RL trains on.

A demonstration is a conversation `{"messages": [...], "tools": [...]}` in OpenAI chat form; each
assistant message becomes one transition whose prompt is the chat template of the messages before
it (with the generation prompt) and whose response is what the template adds for that message,
through its end-of-turn token: exactly what the engine would have generated and the proxy recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from alight import semconv
from alight.adapters.retokenize import retokenize
from alight.errors import ConfigError
from alight.types import Transition


def demonstration_transitions(
    rows: Iterable[Mapping[str, Any]], tokenizer: Any, *, max_length: int | None = None
) -> tuple[list[Transition], int]:
    """The transitions of every assistant message of every row (reward and advantage 1.0), and the
    number of messages dropped for being longer than `max_length` tokens (prompt + response).

    Raises:
        ConfigError: a row without a non-empty `messages` list, or an assistant message the chat
            template cannot render.
    """
    transitions: list[Transition] = []
    dropped = 0
    for row_index, row in enumerate(rows):
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
            prompt_ids, response_ids = ids
            if max_length is not None and len(prompt_ids) + len(response_ids) > max_length:
                dropped += 1
                continue
            transitions.append(
                Transition.unchecked(
                    prompt_ids,
                    response_ids,
                    1.0,
                    f"demo-{row_index}",
                    step_index=step,
                    advantage=1.0,
                )
            )
            step += 1
    return transitions, dropped
