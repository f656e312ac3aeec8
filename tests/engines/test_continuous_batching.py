"""Continuous batching in the embedded engine, on the real tiny model: rows join a running batch
between two tokens and leave it when they end, and each computes what it computes alone; a weight
update waits for the running rows and lets none join meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from alight.engines.base import ChatRequest, Generation, SamplingParams, TextDelta
from alight.engines.embedded import EmbeddedEngine
from alight.engines.sampling import Decoder, Sequence, SequenceOutput

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.anyio

LONG = 300  # greedy decoding of "hi" from the tiny model runs to its token limit


def chat(content: str, max_tokens: int, **sampling: Any) -> ChatRequest:
    sampling.setdefault("temperature", 0.0)
    return ChatRequest(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        sampling=SamplingParams(max_tokens=max_tokens, **sampling),
    )


def decoding_parts(engine: EmbeddedEngine) -> dict[str, Any]:
    tokenizer = engine.tokenizer
    return {
        "pad_id": tokenizer.pad_token_id or 0,
        "eos_ids": {0, 2},
        "decode": lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
    }


def prompt(engine: EmbeddedEngine, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


async def streamed(eng: EmbeddedEngine, request: ChatRequest, started: asyncio.Event) -> Generation:
    """`request` streamed to its end; `started` is set at its first text."""
    generation: Generation | None = None
    async for event in eng.chat_stream(request):
        if isinstance(event, TextDelta):
            started.set()
        else:
            generation = event
    assert generation is not None
    return generation


def generated_alone(engine: EmbeddedEngine, seq: Sequence, **parts: Any) -> SequenceOutput:
    """`seq` generated in a batch of its own."""
    decoder = Decoder(engine.model, **parts)
    decoder.add([seq])
    ended: list[tuple[Sequence, SequenceOutput]] = []
    while decoder.size:
        ended += decoder.step()
    return ended[0][1]


def eager_engine(tiny_dir: Path, **options: Any) -> EmbeddedEngine:
    """An engine that starts a batch 1 ms after an idle spell (so arrivals are not gathered)."""
    return EmbeddedEngine(
        "tiny", cache_dir=tiny_dir, max_new_tokens=LONG, batch_wait_ms=1, max_batch_wait_ms=1, **options
    )


def assert_same(got: SequenceOutput, alone: SequenceOutput) -> None:
    assert got.token_ids == alone.token_ids
    assert got.text == alone.text and got.finish_reason == alone.finish_reason
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(alone.logprobs), atol=1e-4)


def test_rows_that_join_and_leave_a_running_batch_compute_what_they_compute_alone(engine: EmbeddedEngine) -> None:
    parts = decoding_parts(engine)
    texts = ["a much longer prompt than the others, " * 3, "hi", "What is 2+2?", "x" * 40]
    limits = [40, 6, 25, 12]  # the short ones leave while others run: the cache drops rows and padding
    seeds = [None, 3, 4, None]  # greedy rows and sampled rows with their own generators

    def sequences() -> list[Sequence]:
        return [
            Sequence(
                prompt(engine, text),
                max_new_tokens=limit,
                temperature=0.0 if seed is None else 1.0,
                generator=None if seed is None else torch.Generator().manual_seed(seed),
            )
            for text, limit, seed in zip(texts, limits, seeds, strict=True)
        ]

    by_itself = [generated_alone(engine, seq, **parts) for seq in sequences()]
    decoder = Decoder(engine.model, **parts)
    seqs = sequences()
    outputs: dict[int, SequenceOutput] = {}
    joins = {0: [seqs[0]], 3: [seqs[1], seqs[2]], 9: [seqs[3]]}  # by decode step: alone, two together, one late
    step = 0
    while step in joins or decoder.size:
        decoder.add(joins.get(step, []))
        for seq, output in decoder.step():
            outputs[id(seq)] = output
        step += 1
    for seq, expected in zip(seqs, by_itself, strict=True):
        assert_same(outputs[id(seq)], expected)
    assert outputs[id(seqs[1])].token_ids and len(outputs[id(seqs[0])].token_ids) == 40
    assert decoder.size == 0 and decoder.forwards == 3 + 39  # 3 prefills, then one forward per later token


@pytest.mark.parametrize("continuous", [True, False])
async def test_a_request_joins_the_running_batch_instead_of_waiting_for_it_to_end(
    tiny_dir: Path, continuous: bool
) -> None:
    eng = eager_engine(tiny_dir, continuous_batching=continuous)
    await eng.start()
    try:
        long_alone = await eng.chat(chat("hi", LONG))
        short_alone = await eng.chat(chat("What is 2+2?", 4))
        assert len(long_alone.response_token_ids or []) == LONG
        order: list[str] = []

        async def long_call() -> Generation:
            generation = await streamed(eng, chat("hi", LONG), started)
            order.append("long")
            return generation

        async def short_call() -> Generation:
            await started.wait()  # the long row is generating
            generation = await eng.chat(chat("What is 2+2?", 4))
            order.append("short")
            return generation

        started = asyncio.Event()
        long_run, short_run = await asyncio.gather(long_call(), short_call())
    finally:
        await eng.close()
    assert order == (["short", "long"] if continuous else ["long", "short"])  # static: it waits ~300 tokens
    assert long_run.response_token_ids == long_alone.response_token_ids
    assert short_run.response_token_ids == short_alone.response_token_ids
    assert torch.allclose(
        torch.tensor(short_run.response_logprobs), torch.tensor(short_alone.response_logprobs), atol=1e-4
    )


async def test_a_weight_update_waits_for_the_running_rows_and_none_joins_meanwhile(tiny_dir: Path) -> None:
    eng = eager_engine(tiny_dir)
    await eng.start()
    try:
        old_long = await eng.chat(chat("hi", LONG))
        generator = torch.Generator().manual_seed(0)
        original = {k: v.clone() for k, v in eng.model.state_dict().items()}
        changed = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
        await eng.update_weights(changed, 1)
        new_short = await eng.chat(chat("What is 2+2?", 4))
        await eng.update_weights(original, 0)

        started, update_called = asyncio.Event(), asyncio.Event()

        async def update() -> None:
            await started.wait()
            task = asyncio.create_task(eng.update_weights(changed, 1))
            await asyncio.sleep(0.05)  # the update waits for the long row, holding new ones back
            update_called.set()
            await task

        async def short_call() -> Generation:
            await update_called.wait()
            return await eng.chat(chat("What is 2+2?", 4))

        long_run, _, short_run = await asyncio.gather(streamed(eng, chat("hi", LONG), started), update(), short_call())
    finally:
        await eng.close()
    assert long_run.weights_version == 0 and long_run.response_token_ids == old_long.response_token_ids
    assert short_run.weights_version == 1  # it did not join the old weights' batch
    assert short_run.response_token_ids == new_short.response_token_ids


async def test_requests_of_another_adapter_wait_for_the_running_batch(tiny_dir: Path) -> None:
    """One adapter per forward: a request for another adapter starts a batch of its own once the
    running one ends; both give what they give alone."""
    torch.manual_seed(0)  # peft draws lora_A from the global generator: the test's own, not its neighbours'
    eng = eager_engine(
        tiny_dir, adapters=["alpha", "beta"], lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    )
    await eng.start()

    def agent_chat(agent: str, content: str, max_tokens: int) -> ChatRequest:
        request = chat(content, max_tokens)
        request.agent = agent
        return request

    try:
        import peft

        model = eng.model
        assert isinstance(model, peft.PeftModel)
        with torch.no_grad():  # make adapter beta answer differently from alpha
            for name, param in model.named_parameters():
                if "lora_B" in name and ".beta." in name:
                    param.add_(0.3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
        alone_a = await eng.chat(agent_chat("alpha", "hi", 40))
        alone_b = await eng.chat(agent_chat("beta", "hi", 8))
        assert alone_a.adapter == "alpha" and alone_b.adapter == "beta"
        assert alone_a.response_token_ids[:8] != alone_b.response_token_ids  # type: ignore[index]
        order: list[str] = []

        async def call(agent: str, max_tokens: int, delay: float) -> Generation:
            await asyncio.sleep(delay)
            generation = await eng.chat(agent_chat(agent, "hi", max_tokens))
            order.append(agent)
            return generation

        together_a, together_b = await asyncio.gather(call("alpha", 40, 0.0), call("beta", 8, 0.05))
    finally:
        await eng.close()
    assert order == ["alpha", "beta"]  # beta, 8 tokens, waited for alpha's 40
    assert together_a.response_token_ids == alone_a.response_token_ids
    assert together_b.response_token_ids == alone_b.response_token_ids
