"""The embedded engine on the real tiny model: ids, log-probs, batching, sampling, weights, errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from alight.engines.base import ChatRequest, CompletionRequest, Generation, SamplingParams, TextDelta
from alight.engines.embedded import EmbeddedEngine
from alight.errors import InvalidRequestError
from tests.fixtures.tools import ADD_TOOLS

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.anyio

TOOLS = ADD_TOOLS


def chat(content: str = "Hello there", **sampling: Any) -> ChatRequest:
    sampling.setdefault("temperature", 0.0)
    return ChatRequest(
        model="tiny", messages=[{"role": "user", "content": content}], sampling=SamplingParams(**sampling)
    )


def full_forward_logprobs(model: Any, prompt: list[int], response: list[int], temperature: float) -> Any:
    """Log-probs of the response under one plain forward pass over prompt + response (no cache)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    scaled = logits[len(prompt) - 1 : -1] / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


async def test_prompt_ids_are_the_chat_template_and_decode_back(engine: EmbeddedEngine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    request = ChatRequest(model="tiny", messages=messages, sampling=SamplingParams(temperature=0, max_tokens=20))
    generation = await engine.chat(request)
    template = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert generation.prompt_token_ids == engine.tokenizer.encode(template, add_special_tokens=False)
    assert generation.response_token_ids and generation.response_logprobs
    assert len(generation.response_logprobs) == len(generation.response_token_ids) == generation.completion_tokens
    assert generation.prompt_tokens == len(generation.prompt_token_ids)
    ended = generation.response_token_ids[-1] in (0, 2)  # <|endoftext|>, <|im_end|>: included when generated
    assert generation.finish_reason == ("stop" if ended else "length")
    suffix = engine.tokenizer.decode(generation.response_token_ids[-1:]) if ended else ""
    decoded = engine.tokenizer.decode(generation.prompt_token_ids + generation.response_token_ids)
    assert decoded == template + generation.text + suffix
    assert generation.token_ids_source == "engine"
    assert generation.weights_version == 0
    assert generation.model == "tiny"
    assert generation.message == {"role": "assistant", "content": generation.text}  # no tools: no parsing


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
async def test_logprobs_match_a_plain_forward_pass(engine: EmbeddedEngine, temperature: float) -> None:
    generation = await engine.chat(chat("Tell me a story", temperature=temperature, max_tokens=24, seed=5))
    assert generation.prompt_token_ids is not None and generation.response_token_ids is not None
    expected = full_forward_logprobs(
        engine.model, generation.prompt_token_ids, generation.response_token_ids, temperature
    )
    assert torch.allclose(torch.tensor(generation.response_logprobs), expected, atol=1e-4)


async def test_a_batch_gives_what_each_request_gives_alone(engine: EmbeddedEngine) -> None:
    prompts = ["a", "Hello there, how are you?", "What is 2+2?", "x" * 50, "Tools please", "Why?"]
    alone = [await engine.chat(chat(p, max_tokens=16)) for p in prompts]
    together = await asyncio.gather(*(engine.chat(chat(p, max_tokens=16)) for p in prompts))
    for one, batched in zip(alone, together, strict=True):
        assert batched.response_token_ids == one.response_token_ids
        assert batched.text == one.text
        assert torch.allclose(torch.tensor(batched.response_logprobs), torch.tensor(one.response_logprobs), atol=1e-4)


async def test_requests_that_trickle_in_start_one_batch(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """32 concurrent requests arriving a few ms apart (as rendered prompts do) are prefilled
    together: an idle engine waits for them rather than starting on the first."""
    from alight.engines import sampling

    sizes: list[int] = []
    add = sampling.Decoder.add

    def counting(self: Any, batch: list[Any]) -> None:
        sizes.append(len(batch))
        add(self, batch)

    monkeypatch.setattr(sampling.Decoder, "add", counting)
    # gaps of 3 ms against a 50 ms allowance: robust on a loaded machine; a deadline fixed at the
    # first request (50 ms) would cut the ~100 ms of arrivals in two
    eng = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=4, batch_wait_ms=50, max_batch_wait_ms=5000)
    await eng.start()

    async def late(i: int) -> Generation:
        await asyncio.sleep(0.003 * i)  # 32 requests over ~100 ms, 3 ms apart
        return await eng.chat(chat(f"question {i}", max_tokens=4))

    try:
        await asyncio.gather(*(late(i) for i in range(32)))
    finally:
        await eng.close()
    assert sizes == [32]


async def test_seeds_reproduce_also_inside_a_batch(engine: EmbeddedEngine) -> None:
    first = await engine.chat(chat(temperature=1.0, top_p=0.9, max_tokens=16, seed=11))
    again = await asyncio.gather(
        *(engine.chat(chat(temperature=1.0, top_p=0.9, max_tokens=16, seed=s)) for s in (11, 12))
    )
    assert again[0].response_token_ids == first.response_token_ids
    assert again[1].response_token_ids != first.response_token_ids


async def test_stop_string_cuts_the_text(engine: EmbeddedEngine) -> None:
    sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 32}
    free = await engine.chat(chat(**sampled))
    assert free.response_token_ids is not None
    visible = [c for c in free.text[3:] if c.isascii() and c.isprintable()]
    assert visible, free.text
    stop = visible[0]
    stopped = await engine.chat(chat(**sampled, stop=["never appears", stop]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(stop)]
    assert stopped.response_token_ids == free.response_token_ids[: len(stopped.response_token_ids)]


async def test_two_stop_strings_that_both_match_cut_at_the_earliest(engine: EmbeddedEngine) -> None:
    """Two stops ending on the same character complete on the same token: the text is cut where the
    earlier one starts, not at the one listed first."""
    sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 32}
    free = await engine.chat(chat(**sampled))
    text = free.text
    windows = [
        start
        for start in range(3, len(text) - 4)
        if all(c.isascii() and c.isprintable() for c in text[start : start + 4])
        and text.find(text[start : start + 4]) == start
        and text.find(text[start + 1 : start + 4]) == start + 1
    ]
    assert windows, text
    start = windows[0]
    early, late = text[start : start + 4], text[start + 1 : start + 4]
    stopped = await engine.chat(chat(**sampled, stop=[late, early]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[:start]


async def test_max_tokens_ends_with_length(engine: EmbeddedEngine) -> None:
    generation = await engine.chat(chat(max_tokens=3))
    assert generation.finish_reason == "length"
    assert generation.response_token_ids is not None and len(generation.response_token_ids) == 3


async def test_streaming_gives_the_same_answer_in_pieces(engine: EmbeddedEngine) -> None:
    plain = await engine.chat(chat(temperature=1.0, seed=4, max_tokens=20))
    events = [event async for event in engine.chat_stream(chat(temperature=1.0, seed=4, max_tokens=20))]
    assert len(events) > 3
    assert isinstance(events[-1], Generation)
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    final = events[-1]
    assert final.response_token_ids == plain.response_token_ids
    assert final.response_logprobs == pytest.approx(plain.response_logprobs, abs=1e-5)
    assert "".join(e.text for e in events[:-1] if isinstance(e, TextDelta)) == (final.message["content"] or "")


async def test_complete_takes_text_or_ids_without_template(engine: EmbeddedEngine) -> None:
    by_text = await engine.complete(CompletionRequest(model="tiny", prompt="Once upon", sampling=SamplingParams(0.0)))
    assert by_text.prompt_token_ids == engine.tokenizer.encode("Once upon", add_special_tokens=False)
    assert by_text.prompt_token_ids is not None
    by_ids = await engine.complete(
        CompletionRequest(model="tiny", prompt=by_text.prompt_token_ids, sampling=SamplingParams(0.0))
    )
    assert by_ids.response_token_ids == by_text.response_token_ids
    assert by_ids.message == {"role": "assistant", "content": by_ids.text}


async def test_tool_calls_and_tool_results_render_through_the_template(engine: EmbeddedEngine) -> None:
    messages = [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    request = ChatRequest(model="tiny", messages=messages, tools=TOOLS, sampling=SamplingParams(0.0, max_tokens=4))
    generation = await engine.chat(request)
    assert generation.prompt_token_ids is not None
    prompt = engine.tokenizer.decode(generation.prompt_token_ids)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in prompt
    assert prompt.endswith("<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (ChatRequest(model="gpt-9", messages=[{"role": "user", "content": "hi"}]), "unknown model"),
        (ChatRequest(model="tiny", messages=[]), "messages must be a non-empty list"),
        (ChatRequest(model="tiny", messages=[{"role": "wizard", "content": "hi"}]), "role must be one of"),
        (ChatRequest(model="tiny", messages=[{"role": "user"}]), "content is missing"),
        (
            ChatRequest(model="tiny", messages=[{"role": "user", "content": "x" * 1100}]),
            "maximum context length is 1024 tokens",
        ),
        (
            ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function"}]),
            "function",
        ),
        (
            ChatRequest(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}],
            ),
            "parameters must be a JSON schema object",
        ),
        (ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(-1)), "temp"),
    ],
)
async def test_bad_requests_are_one_line_errors_and_the_engine_keeps_serving(
    engine: EmbeddedEngine, request_: ChatRequest, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message) as err:
        await engine.chat(request_)
    assert "\n" not in str(err.value)
    assert (await engine.chat(chat(max_tokens=2))).completion_tokens == 2


async def test_bad_completion_prompts(engine: EmbeddedEngine) -> None:
    for prompt in ([10**6], [], "", [1.5]):
        with pytest.raises(InvalidRequestError):
            await engine.complete(CompletionRequest(model="tiny", prompt=prompt))  # type: ignore[arg-type]


async def test_weight_update_in_place_changes_output_and_version(tiny_dir: Path, tmp_path: Path) -> None:
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=16)
    try:
        before = await engine.chat(chat())
        params = engine.model.model.embed_tokens.weight
        generator = torch.Generator().manual_seed(0)
        state = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in engine.model.state_dict().items()}
        await engine.update_weights(state, 7)
        after = await engine.chat(chat())
        assert engine.weights_version == after.weights_version == 7
        assert after.response_token_ids != before.response_token_ids
        assert engine.model.model.embed_tokens.weight is params  # same tensors, new values

        # from a checkpoint directory: back to the original weights
        await engine.update_weights(str(tiny_dir), 8)
        again = await engine.chat(chat())
        assert again.weights_version == 8
        assert again.response_token_ids == before.response_token_ids
    finally:
        await engine.close()


async def test_weights_that_do_not_fit_are_refused(tiny_dir: Path) -> None:
    from alight.errors import ConfigError

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir)
    state = dict(engine.model.state_dict())
    state["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConfigError, match=r"unknown: model\.extra\.weight"):
        await engine.update_weights(state, 1)
    state.pop("model.extra.weight")
    state["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ConfigError, match=r"wrong shape: model\.norm\.weight"):
        await engine.update_weights(state, 1)
    assert engine.weights_version == 0


@pytest.mark.parametrize(("native", "want"), [(True, "bfloat16"), (False, "float32")])
def test_dtype_auto_is_bfloat16_where_the_cpu_has_it(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, native: bool, want: str
) -> None:
    from alight.engines import embedded

    monkeypatch.setattr(embedded, "native_bf16", lambda device: native)
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, dtype="auto")
    engine.load()
    assert next(engine.model.parameters()).dtype == getattr(torch, want)
    pinned = EmbeddedEngine("tiny", cache_dir=tiny_dir, dtype="float32")  # a dtype named is kept
    pinned.load()
    assert next(pinned.model.parameters()).dtype == torch.float32
