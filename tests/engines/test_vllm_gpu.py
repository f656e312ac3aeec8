"""The vLLM engine for real: `vllm serve` on the tiny model (needs vLLM and a CUDA GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from alight.engines.base import ChatRequest, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.anyio]


def _skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return 'vLLM is not installed (pip install "alight[vllm]")'
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


async def test_vllm_serves_the_tiny_model_with_ids_and_reloads_weights(tiny_dir: Path, tmp_path: Path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from alight.engines.vllm_engine import VLLMEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, gpu_memory_utilization=0.2,
                        extra_args=["--enforce-eager"])  # fmt: skip
    messages = [{"role": "user", "content": "Hello"}]
    request = ChatRequest(model="tiny", messages=messages, sampling=SamplingParams(temperature=0, max_tokens=16))
    await engine.start()
    try:
        before = await engine.chat(request)
        template = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert before.token_ids_source == "engine"
        assert before.prompt_token_ids == tokenizer.encode(template, add_special_tokens=False)
        assert before.response_token_ids and before.response_logprobs
        assert len(before.response_logprobs) == len(before.response_token_ids)

        generator = torch.Generator().manual_seed(0)
        weights = load_file(str(tiny_dir / "model.safetensors"))
        state = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
        await engine.update_weights(state, 1)
        after = await engine.chat(request)
        assert after.weights_version == 1
        assert after.response_token_ids != before.response_token_ids
    finally:
        await engine.close()
