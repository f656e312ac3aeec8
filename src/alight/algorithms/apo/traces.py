"""The traces the optimiser reads: a rollout's conversation (messages, tool calls and their
results), its other tool spans and its reward, as bounded plain text built from the store's spans."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from alight import semconv

if TYPE_CHECKING:
    from alight.store.base import Store

MESSAGE_CHARS = 400  # one message's content keeps its head and tail beyond this


def clip(text: str, limit: int) -> str:
    """`text`, or its head and tail around a `[... N characters cut ...]` mark when longer than `limit`."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 40)
    head, tail = text[: keep // 2], text[len(text) - keep // 2 :] if keep // 2 else ""
    return f"{head}[... {len(text) - len(head) - len(tail)} characters cut ...]{tail}"


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        text += f"\n[tool call] {function.get('name')}({function.get('arguments')})"
    return text.strip()


def render_trace(spans: Sequence[Mapping[str, Any]], reward: float | None, max_chars: int) -> str:
    """One rollout's spans (dicts in Span's JSON shape, in order) as text of at most `max_chars`:
    the conversation of its last LLM call (request messages and the answer), the tool spans whose
    results are not in it, and the reward."""
    llm = [s for s in spans if s.get("kind") == "llm"]
    lines: list[str] = []
    if llm:
        attributes = llm[-1].get("attributes") or {}
        messages = list(attributes.get(semconv.LLM_REQUEST_MESSAGES) or [])
        answer = attributes.get(semconv.LLM_RESPONSE_MESSAGE)
        if isinstance(answer, Mapping):
            messages.append(answer)
        for message in messages:
            if isinstance(message, Mapping):
                lines.append(f"{message.get('role', '?')}: {clip(_content(message), MESSAGE_CHARS)}")
    quoted = "\n".join(lines)
    for span in spans:
        if span.get("kind") != "tool":
            continue
        attributes = span.get("attributes") or {}
        output = str(attributes.get(semconv.TOOL_OUTPUT, ""))
        if output and output in quoted:
            continue  # the conversation already shows this result
        arguments = attributes.get(semconv.TOOL_ARGUMENTS)
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        error = " (error)" if attributes.get(semconv.TOOL_ERROR) else ""
        lines.append(clip(f"[tool] {span.get('name')}({arguments}) -> {output}{error}", MESSAGE_CHARS))
    if not lines:
        lines.append("(no LLM call or tool call was recorded)")
    ending = f"reward: {'none (the rollout failed)' if reward is None else f'{reward:g}'}"
    return clip("\n".join(lines), max(0, max_chars - len(ending) - 1)) + "\n" + ending


async def read_traces(store: Store, rewards: Mapping[str, float | None], max_chars: int) -> list[str]:
    """`render_trace` of each rollout in `rewards` (rollout id -> reward), read from `store`."""
    spans = await store.span_dicts(list(rewards))
    return [render_trace(spans.get(rid, []), reward, max_chars) for rid, reward in rewards.items()]
