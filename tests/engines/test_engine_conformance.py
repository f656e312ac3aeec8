"""The engine contract, the same tests on every engine that serves a model alight trains: the embedded
engine and real vLLM (its CPU build, in a venv of its own), both on a copy of the tiny model whose
model files ask for other sampling settings and drop tools from the chat template (`hostile_tiny`).

What every engine must give the trainer: the prompt ids of alight's chat template (tools included), the
answer's ids, and one log-prob per answer token equal to the trainer's own forward pass,
log_softmax(logits / T) at the token over the whole vocabulary (T = 1 for greedy); settings recorded;
context overflow handled one way. The reference log-probs come from a plain transformers forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alight.engines.base import ChatRequest, CompletionRequest, Engine, SamplingParams
from alight.errors import ContextLengthError, InvalidRequestError

pytestmark = pytest.mark.anyio

ENGINES = ["embedded", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]
MESSAGES = [{"role": "user", "content": "What is 17 + 25?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate_sum",
            "description": "Add numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
#: fp32 on both sides; vLLM's CPU kernels sum in another order than transformers' (measured max ~1e-4)
LOGPROB_ATOL = 2e-3


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    name = "hostile_embedded" if request.param == "embedded" else "real_vllm"
    served: Engine = request.getfixturevalue(name)
    return served


@pytest.fixture(scope="module")
def reference(hostile_tiny: Path) -> Any:
    """The trainer's view: a plain transformers forward of the same weights, fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hostile_tiny, dtype="float32")
    model.eval()
    return model


def forward_log_probs(model: Any, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) at each response token (T = 1 for greedy), computed independently."""
    import torch

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    return logp.gather(1, torch.tensor(response)[:, None]).flatten().tolist()


def assert_log_probs_match(got: list[float] | None, want: list[float]) -> None:
    assert got is not None and len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst < LOGPROB_ATOL, f"engine and trainer log-probs differ by up to {worst:.2e}"


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
async def test_log_probs_are_the_trainers_whatever_the_model_files_say(
    engine: Engine, reference: Any, temperature: float
) -> None:
    sampling = SamplingParams(temperature=temperature, max_tokens=12, seed=3)
    out = await engine.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=sampling))
    assert out.prompt_token_ids and out.response_token_ids and out.token_ids_source == "engine"
    want = forward_log_probs(reference, out.prompt_token_ids, out.response_token_ids, temperature)
    assert_log_probs_match(out.response_logprobs, want)
    # the model's top_k 1 / min_p / penalties were not applied: sampling does not collapse to one token
    assert out.sampling is not None
    assert (out.sampling["top_k"], out.sampling["min_p"], out.sampling["repetition_penalty"]) == (-1, 0.0, 1.0)
    assert out.sampling["temperature"] == temperature and out.sampling["top_p"] == 1.0


async def test_a_cut_distribution_never_records_other_log_probs(engine: Engine, reference: Any) -> None:
    """top_p < 1: the embedded engine records the full distribution's log-probs; vLLM can only give
    them renormalised after the cut, so it records none (the trainer recomputes them)."""
    sampling = SamplingParams(temperature=1.0, top_p=0.3, max_tokens=12, seed=5)
    out = await engine.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=sampling))
    assert out.response_token_ids
    if out.response_logprobs is not None:
        want = forward_log_probs(reference, out.prompt_token_ids or [], out.response_token_ids, 1.0)
        assert_log_probs_match(out.response_logprobs, want)
    else:
        assert engine.name == "vllm"


async def test_tools_reach_the_prompt_through_alights_template(
    engine: Engine, hostile_embedded: Engine, hostile_tiny: Path
) -> None:
    from transformers import AutoTokenizer

    request = ChatRequest(model="tiny", messages=MESSAGES, tools=TOOLS, sampling=SamplingParams(0.0, max_tokens=4))
    out = await engine.chat(request)
    tokenizer = AutoTokenizer.from_pretrained(hostile_tiny)
    assert "calculate_sum" in tokenizer.decode(out.prompt_token_ids)
    same = await hostile_embedded.chat(request)
    assert out.prompt_token_ids == same.prompt_token_ids  # one template, one prompt, on every engine


async def test_seeded_sampling_repeats_and_max_tokens_ends_with_length(engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=11)
    first = await engine.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=sampling))
    again = await engine.chat(ChatRequest(model="tiny", messages=MESSAGES, sampling=sampling))
    assert first.response_token_ids == again.response_token_ids
    if len(first.response_token_ids or []) == 6:  # no end-of-turn token drawn first
        assert first.finish_reason == "length"
    assert len(first.response_token_ids or []) <= 6 and first.completion_tokens == len(first.response_token_ids or [])


async def test_completions_from_token_ids(engine: Engine, reference: Any) -> None:
    prompt = [1, 104, 105, 106, 17]
    out = await engine.complete(
        CompletionRequest(model="tiny", prompt=prompt, sampling=SamplingParams(0.0, max_tokens=5))
    )
    assert out.prompt_token_ids == prompt and out.response_token_ids
    assert_log_probs_match(out.response_logprobs, forward_log_probs(reference, prompt, out.response_token_ids, 0.0))


async def test_context_overflow_is_one_error_and_a_long_answer_is_shortened(engine: Engine) -> None:
    limit = engine.max_context
    assert limit == 1024
    long = [{"role": "user", "content": "a " * 1100}]
    with pytest.raises(ContextLengthError, match=r"maximum context length is 1024 tokens; the prompt is \d+"):
        await engine.chat(ChatRequest(model="tiny", messages=long, sampling=SamplingParams(max_tokens=4)))
    near = [{"role": "user", "content": "a " * 480}]  # ~980 tokens
    out = await engine.chat(ChatRequest(model="tiny", messages=near, sampling=SamplingParams(1.0, max_tokens=500)))
    assert (out.prompt_tokens + out.completion_tokens) <= limit


async def test_an_unknown_model_is_a_one_line_error(engine: Engine) -> None:
    with pytest.raises(InvalidRequestError, match="unknown model 'gpt-9'"):
        await engine.chat(ChatRequest(model="gpt-9", messages=MESSAGES))
