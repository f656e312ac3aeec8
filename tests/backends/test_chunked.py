"""Chunked response log-probs equal an independent plain forward pass (full logits, fp32, log-softmax,
gather), in values and in gradients, whatever the chunk size; no chunk holds more logits than asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from alight.backends.chunked import head_log_probs
from alight.backends.embedded import EmbeddedBackend
from alight.config.schema import AlgorithmConfig, LoraConfig
from tests.backends.test_embedded_backend import batch_of, transitions

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def plain(model: Any, batch: Any, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, R] log-probs and entropies from the full logits of the whole batch: the reference."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.float()
    p = batch.prompt_length
    scaled = logits[:, p - 1 : -1] / temperature  # the logits at position t predict token t + 1
    log_p = torch.log_softmax(scaled, dim=-1)
    lp = log_p.gather(-1, batch.responses[..., None])[..., 0]
    ent = -(log_p.exp() * log_p).sum(-1)
    mask = batch.response_mask.float()
    return lp * mask, ent * mask


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize(("chunk", "temperature"), [(1, 1.0), (3, 0.7), (7, 1.0), (10_000, 1.3)])
def test_chunked_log_probs_and_gradients_equal_a_plain_forward(
    tiny_dir: Path, chunk: int, temperature: float, lora: bool
) -> None:
    rows = transitions([1.0, -1.0, 0.5, 0.2, -0.3], seed=3)  # 5 rows, responses of 2..11 tokens
    batch = batch_of(rows)
    lora_cfg = LoraConfig(enabled=lora, target_modules=["q_proj", "v_proj", "up_proj"])
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(log_prob_chunk=chunk, lora=lora_cfg), temperature=temperature, seed=0)
    if lora:  # non-zero adapters, so the adapters' path is exercised
        with torch.no_grad():
            for name, p in b.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    params = [p for p in b.model.parameters() if p.requires_grad]
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(0))

    lp, ent = b.log_probs(batch, entropy=True)
    assert ent is not None
    grads = torch.autograd.grad((lp * weights).sum() + ent.sum(), params)
    expected_lp, expected_ent = plain(b.model, batch, temperature)
    expected_grads = torch.autograd.grad((expected_lp * weights).sum() + expected_ent.sum(), params)

    assert torch.allclose(lp, expected_lp, atol=2e-5, rtol=0), (lp - expected_lp).abs().max()
    assert torch.allclose(ent, expected_ent, atol=2e-5, rtol=0)
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


def test_no_chunk_is_larger_than_asked_and_padding_is_not_scored() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    seen: list[int] = []

    def recording(h: torch.Tensor) -> torch.Tensor:
        seen.append(h.shape[0])
        return head(h)

    hidden = torch.randn(3, 4, 8, requires_grad=True)
    targets = torch.randint(0, 50, (3, 4))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    lp, ent = head_log_probs(hidden, recording, targets, mask, chunk_tokens=3)
    assert ent is None
    assert seen == [3, 3, 1]  # 7 masked tokens in chunks of 3; the 5 padding positions never reach the head
    assert (lp[mask == 0] == 0).all()
    want = torch.log_softmax(head(hidden), -1).gather(-1, targets[..., None])[..., 0] * mask
    assert torch.allclose(lp, want, atol=1e-6)
    seen.clear()
    lp.sum().backward()
    assert seen == [1, 3, 3]  # backward recomputes each chunk (checkpointed), one at a time, last first
