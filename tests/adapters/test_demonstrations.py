"""Demonstrations become transitions with the real tiny tokenizer: what the engine would have generated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alight.adapters.demonstrations import demonstration_transitions
from alight.errors import ConfigError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Use the tool."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def template(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The prompt text as Hugging Face renders it (tool-call arguments as mappings, as HF templates expect)."""
    as_hf = [
        {**m, "tool_calls": [{**CALL, "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
        if m.get("tool_calls")
        else m
        for m in messages
    ]
    return str(tokenizer.apply_chat_template(as_hf, tools=TOOLS, add_generation_prompt=True, tokenize=False))


def test_each_assistant_message_of_a_tool_conversation_is_a_transition(tokenizer: Any) -> None:
    transitions, dropped = demonstration_transitions([{"messages": MESSAGES, "tools": TOOLS}], tokenizer)
    assert dropped == 0
    call, answer = transitions
    assert tokenizer.decode(call.prompt_ids) == template(tokenizer, MESSAGES[:2])
    assert "# Tools" in tokenizer.decode(call.prompt_ids)
    assert tokenizer.decode(call.response_ids) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    )
    assert tokenizer.decode(answer.prompt_ids) == template(tokenizer, MESSAGES[:4])
    assert tokenizer.decode(answer.response_ids) == "It is 5.<|im_end|>"
    # the second prompt continues the first turn exactly as the model generated it
    assert answer.prompt_ids[: len(call.prompt_ids) + len(call.response_ids)] == call.prompt_ids + call.response_ids
    for step, t in enumerate(transitions):
        assert (t.rollout_id, t.step_index, t.reward, t.advantage, t.response_logprobs) == (
            "demo-0",
            step,
            1.0,
            1.0,
            None,
        )


def test_rows_are_numbered_and_a_leading_assistant_message_is_no_target(tokenizer: Any) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "ok"}]},
        {"messages": MESSAGES[1:3] + MESSAGES[3:], "tools": TOOLS},
    ]
    transitions, _ = demonstration_transitions(rows, tokenizer)
    assert [(t.rollout_id, t.step_index) for t in transitions] == [("demo-0", 0), ("demo-2", 0), ("demo-2", 1)]


@pytest.mark.parametrize("row", [{}, {"messages": []}, {"messages": "hi"}, ["not", "a", "mapping"]])
def test_rows_without_messages_are_config_errors(tokenizer: Any, row: Any) -> None:
    good = {"messages": MESSAGES, "tools": TOOLS}
    with pytest.raises(ConfigError, match=r"demonstration 1: needs a non-empty 'messages' list"):
        demonstration_transitions([good, row], tokenizer)


def test_a_message_the_template_cannot_render_is_a_config_error(tokenizer: Any) -> None:
    bad_call = {**CALL, "function": {"name": "add", "arguments": "{not json"}}
    messages = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": None, "tool_calls": [bad_call]}]
    with pytest.raises(ConfigError, match="demonstration 0: message 1 cannot be rendered"):
        demonstration_transitions([{"messages": messages}], tokenizer)


def test_max_length_drops_long_messages_and_counts_them(tokenizer: Any) -> None:
    (call, answer), _ = demonstration_transitions([{"messages": MESSAGES, "tools": TOOLS}], tokenizer)
    short = len(call.prompt_ids) + len(call.response_ids)
    long = len(answer.prompt_ids) + len(answer.response_ids)
    assert short < long
    kept, dropped = demonstration_transitions([{"messages": MESSAGES, "tools": TOOLS}], tokenizer, max_length=short)
    assert dropped == 1 and [t.response_ids for t in kept] == [call.response_ids]
    assert kept[0].step_index == 0
    kept, dropped = demonstration_transitions([{"messages": MESSAGES, "tools": TOOLS}], tokenizer, max_length=long)
    assert (len(kept), dropped) == (2, 0)
    kept, dropped = demonstration_transitions([{"messages": MESSAGES, "tools": TOOLS}] * 3, tokenizer, max_length=5)
    assert (kept, dropped) == ([], 6)


def test_trajectory_mode_packs_a_conversation_into_one_masked_sequence(tokenizer: Any) -> None:
    call = {"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "a*b"}'}}
    row = {
        "messages": [
            {"role": "user", "content": "Tom buys 12 bags of 3 apples. How many?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "36"},
            {"role": "assistant", "content": "Done."},
        ],
        "tools": [
            {"type": "function", "function": {"name": "calculate", "parameters": {"properties": {"expression": {}}}}}
        ],
    }
    (first, second), _ = demonstration_transitions([row], tokenizer)
    (packed,), dropped = demonstration_transitions([row], tokenizer, mode="trajectory")
    assert dropped == 0 and packed.prompt_ids == first.prompt_ids
    mask = packed.response_mask
    assert mask is not None and len(mask) == len(packed.response_ids)
    trained = [t for t, m in zip(packed.response_ids, mask, strict=True) if m]
    assert trained == list(first.response_ids) + list(second.response_ids)  # the same targets, once each
    inserted = tokenizer.decode([t for t, m in zip(packed.response_ids, mask, strict=True) if not m])
    assert "36" in inserted and "<tool_response>" in inserted  # the tool result is context, not a target
