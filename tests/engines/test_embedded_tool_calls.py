"""End to end: overfit the tiny model on one tool call, load the weights into the engine, get the call back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from alight.chat_template import render_prompt
from alight.engines.base import ChatRequest, Generation, SamplingParams, TextDelta
from alight.engines.embedded import EmbeddedEngine

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object"},
        },
    }
]
MESSAGES = [{"role": "user", "content": "2+3?"}]
TARGET = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'


def overfit(model_dir: Path, prompt: str, budget_s: float = 90.0) -> dict[str, object]:
    """AdamW steps on one chat example (loss on the assistant turn only) until greedy decoding gives it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).train()
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    target_ids = tokenizer.encode(TARGET, add_special_tokens=False)
    ids = torch.tensor([prompt_ids + target_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only fight over a shared CPU
    try:
        start, streak = time.monotonic(), 0
        for _ in range(400):
            out = model(input_ids=ids, labels=labels)
            predicted = out.logits[0, len(prompt_ids) - 1 : -1].argmax(-1)
            streak = streak + 1 if predicted.tolist() == target_ids else 0
            if streak >= 3 or time.monotonic() - start > budget_s:  # every target token is the argmax
                break
            optimizer.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.slow
async def test_overfit_model_returns_parsed_tool_calls(tiny_dir: Path) -> None:
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=120)
    try:
        prompt = render_prompt(engine.tokenizer, MESSAGES, TOOLS)
        await engine.update_weights(overfit(tiny_dir, prompt), 1)
        request = ChatRequest(model="tiny", messages=MESSAGES, tools=TOOLS, sampling=SamplingParams(temperature=0))
        generation = await engine.chat(request)
        assert generation.text == TARGET.removesuffix("<|im_end|>")
        assert generation.finish_reason == "tool_calls"
        assert generation.weights_version == 1
        assert generation.message["content"] == "Adding."
        [call] = generation.message["tool_calls"]
        assert call["function"]["name"] == "add"
        assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
        assert generation.response_token_ids is not None
        assert engine.tokenizer.decode(generation.response_token_ids) == TARGET

        events = [e async for e in engine.chat_stream(request)]
        deltas = [e.text for e in events if isinstance(e, TextDelta)]
        assert "".join(deltas) == "Adding."  # markup never streamed
        assert len(deltas) > 1
        final = events[-1]
        assert isinstance(final, Generation)
        assert final.message["tool_calls"][0]["function"] == call["function"]
        assert final.response_token_ids == generation.response_token_ids

        no_tools = ChatRequest(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none")
        assert "tool_calls" not in (await engine.chat(no_tools)).message
    finally:
        await engine.close()
