"""Re-tokenisation of client-recorded calls with the real tiny tokenizer (chat template + tool calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alight.adapters import AdapterStats, SpanAdapter
from tests.adapters.factory import Trace

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def test_prompt_and_response_ids_are_rebuilt_from_the_messages(tokenizer: Any) -> None:
    trace = Trace()
    trace.llm(None, None, messages=MESSAGES, reply={"role": "assistant", "content": "4"})
    stats = AdapterStats()
    out = SpanAdapter(tokenizer=tokenizer).adapt(trace.spans, rollout_id="ro-1", stats=stats)
    (transition,) = out.transitions
    expected_prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(transition.prompt_ids) == expected_prompt
    assert tokenizer.decode(transition.response_ids) == "4<|im_end|>"  # what the model generates, no newline
    assert transition.response_logprobs is None
    assert stats.calls_retokenized == 1 and stats.logprobs_missing == 1  # the backend recomputes them


def test_tool_calls_and_tools_are_rendered_and_a_length_cut_has_no_end_token(tokenizer: Any) -> None:
    from alight import semconv

    trace = Trace()
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}],
    }
    span = trace.llm(None, None, messages=MESSAGES, reply=reply)
    span.attributes[semconv.LLM_REQUEST_TOOLS] = TOOLS
    cut = trace.llm(None, None, messages=MESSAGES, reply={"role": "assistant", "content": "44"})
    cut.attributes[semconv.LLM_FINISH_REASON] = "length"
    first, second = SpanAdapter(tokenizer=tokenizer).adapt(trace.spans, rollout_id="ro-1").transitions
    assert "# Tools" in tokenizer.decode(first.prompt_ids)
    assert (
        tokenizer.decode(first.response_ids)
        == '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call><|im_end|>'
    )
    assert tokenizer.decode(second.response_ids) == "44"


def test_messages_the_template_rejects_skip_the_call(tokenizer: Any) -> None:
    trace = Trace()
    trace.llm(None, None, messages=[{"role": "wizard", "content": "x"}], reply={"role": "assistant", "content": "y"})
    stats = AdapterStats()
    assert SpanAdapter(tokenizer=tokenizer).adapt(trace.spans, rollout_id="ro-1", stats=stats).transitions == []
    assert stats.calls_skipped_no_ids == 1
