"""The memory estimate of an embedded update, checked against hand arithmetic, and the refusals
and "auto" micro-batch size built on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.backends import memory
from alight.backends.embedded import EmbeddedBackend
from alight.backends.memory import ModelShape
from alight.config.schema import AlgorithmConfig, LoraConfig
from alight.errors import ConfigError
from tests.backends.test_embedded_backend import batch_of, transitions

# A made-up model with round numbers: 1000 weights, 100 of them trained.
SHAPE = ModelShape(params=1000, trainable=100, layers=2, hidden=10, intermediate=20, kv=5, vocab=50)


@pytest.mark.parametrize(
    ("reference", "engine", "expected"),
    [
        (False, False, 4 * (1000 + 100 * 3)),  # weights + gradient + AdamW's 2 moments of the trained ones
        (True, False, 4 * (2000 + 300)),
        (True, True, 4 * (3000 + 300)),
    ],
)
def test_fixed_bytes(reference: bool, engine: bool, expected: int) -> None:
    assert memory.fixed_bytes(SHAPE, reference=reference, engine_copy=engine) == expected


def test_token_bytes_per_layer_and_with_checkpointing() -> None:
    layer = 4 * (16 * 10 + 4 * 5 + 4 * 20)  # 1040 bytes per token and layer
    assert memory.token_bytes(SHAPE) == pytest.approx(1.3 * 2 * layer, abs=1)
    # checkpointing keeps one hidden state per layer and recomputes one layer at a time
    assert memory.token_bytes(SHAPE, gradient_checkpointing=True) == pytest.approx(1.3 * (2 * 4 * 10 + layer), abs=1)


@pytest.mark.parametrize(
    ("budget", "row_tokens", "chunk", "expected"),
    [
        # per row: 100 tokens x ceil(1.3 x 2 x 1040) = 270_400; head: ceil(1.3 x 4 x 4 x 8 x 50) = 8320
        (10_000 + 8320 + 3 * 270_400, 100, 8, 3),
        (10_000 + 8320 + 3 * 270_400 - 1, 100, 8, 2),
        (10_000 + 8320 - 1, 100, 8, 0),
        # unchunked: every response token's logits, per row: 100 x ceil(1.3 x 16 x 50) = 104_000 more
        (10_000 + 3 * (270_400 + 104_000), 100, 0, 3),
    ],
)
def test_fitting_micro_batch(budget: int, row_tokens: int, chunk: int, expected: int) -> None:
    got = memory.fitting_micro_batch(SHAPE, budget, row_tokens, chunk_tokens=chunk, checkpointing=False, fixed=10_000)
    assert got == expected


def test_the_model_shape_counts_a_tied_head_once_and_lora_trains_only_adapters(tiny_dir: Path) -> None:
    full = EmbeddedBackend(tiny_dir, AlgorithmConfig(), seed=0)
    lora = EmbeddedBackend(tiny_dir, AlgorithmConfig(lora=LoraConfig(enabled=True)), seed=0)
    config = full.model.config
    assert full.shape.params == sum(p.numel() for p in full.model.parameters())  # parameters() dedupes ties
    assert full.shape.trainable == full.shape.params
    assert (full.shape.layers, full.shape.vocab) == (config.num_hidden_layers, config.vocab_size)
    assert 0 < lora.shape.trainable < lora.shape.params // 10


def test_a_micro_batch_that_cannot_fit_is_refused_before_the_first_step(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 200 * 1024**2)
    with pytest.raises(ConfigError, match=r"micro_batch_size=4096 needs .* set algorithm.micro_batch_size=auto"):
        EmbeddedBackend(tiny_dir, AlgorithmConfig(micro_batch_size=4096), seed=0, row_tokens=512)
    EmbeddedBackend(tiny_dir, AlgorithmConfig(micro_batch_size=4), seed=0, row_tokens=512)  # fits
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 1024)
    with pytest.raises(ConfigError, match=r"use algorithm\.lora\.enabled=true or a smaller model"):
        EmbeddedBackend(tiny_dir, AlgorithmConfig(micro_batch_size="auto"), seed=0)


def test_auto_takes_the_most_rows_that_fit_and_at_least_one(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(micro_batch_size="auto", memory_fraction=0.5), seed=0)
    batch = batch_of(transitions([1.0] * 6))
    width = batch.input_ids.shape[1]
    per_row = width * memory.token_bytes(b.shape)
    fixed = b._pending_bytes() + memory.head_bytes(b.shape, 512, width, 1)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 2 * (fixed + 3 * per_row))
    assert b._micro_batch_size(batch) == 3  # half of the free memory: 3 rows beside the fixed part
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 2 * (fixed + 100 * per_row))
    assert b._micro_batch_size(batch) == 6  # never more than the batch
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 0)
    assert b._micro_batch_size(batch) == 1
    b.update(batch)  # runs
