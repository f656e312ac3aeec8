"""How much memory an embedded update needs, and the micro-batch size that fits.

An estimate from the model's shape, in bytes, fp32 (what the embedded backend trains in):

- fixed: the weights, plus for every trainable weight its gradient and AdamW's two moments, plus a
  frozen KL reference (a copy of the weights) and the embedded engine's copy when they are kept;
- per token of a micro-batch: the activations autograd keeps for backward, per decoder layer
  (`ACTIVATIONS_PER_LAYER`: 16 hidden-sized tensors: the two RMS norms' fp32 steps, projections'
  inputs, rotary copies of the queries, keys and values repeated to every head, attention output;
  4 key/value-sized; 4 MLP-sized: gate, up, their activation and product; SmolLM2-135M measured
  ~2.4 MB per token in all, this counts ~1.9 MB before `SAFETY`), or with
  gradient checkpointing one hidden state per layer plus one layer's full set, recomputed;
- the output layer: `log_prob_chunk` tokens' logits over the vocabulary, a few copies at once.

`SAFETY` covers what the count leaves out (allocator slack, attention workspaces, autograd's
temporary gradients). Pure functions over numbers, tested with small tables.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

FLOAT = 4  # bytes per fp32 value
ADAMW_STATES = 2  # exp_avg, exp_avg_sq
SAFETY = 1.3  # multiplies the per-token and output-layer estimates
LOGIT_COPIES = 4  # logits, log-softmax, its exp (entropy) and a gradient, per chunk token
GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a model: parameter counts and layer sizes."""

    params: int  # every weight
    trainable: int  # weights with requires_grad (LoRA: the adapters only)
    layers: int
    hidden: int
    intermediate: int
    kv: int  # key/value width: kv heads x head size
    vocab: int


def model_shape(model: Any) -> ModelShape:
    """The shape of a `transformers` causal LM (peft-wrapped or not)."""
    config = model.config
    hidden = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    unique = {id(p): p for p in model.parameters()}.values()  # a tied output layer counts once
    return ModelShape(
        params=sum(p.numel() for p in unique),
        trainable=sum(p.numel() for p in unique if p.requires_grad),
        layers=int(config.num_hidden_layers),
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        kv=kv_heads * head_dim,
        vocab=int(config.vocab_size),
    )


def fixed_bytes(shape: ModelShape, *, reference: bool = False, engine_copy: bool = False) -> int:
    """Weights, gradients and AdamW state of the trainable weights, a reference and an engine copy."""
    copies = 1 + int(reference) + int(engine_copy)
    return FLOAT * (copies * shape.params + shape.trainable * (1 + ADAMW_STATES))


ACTIVATIONS_PER_LAYER = (16, 4, 4)  # hidden-, kv- and intermediate-sized tensors kept per token and layer


def token_bytes(shape: ModelShape, *, gradient_checkpointing: bool = False) -> int:
    """Activation bytes autograd keeps per token of a micro-batch (see the module docstring)."""
    h, kv, i = ACTIVATIONS_PER_LAYER
    layer = FLOAT * (h * shape.hidden + kv * shape.kv + i * shape.intermediate)
    if gradient_checkpointing:
        return math.ceil(SAFETY * (shape.layers * FLOAT * shape.hidden + layer))
    return math.ceil(SAFETY * shape.layers * layer)


def head_bytes(shape: ModelShape, chunk_tokens: int, row_tokens: int, rows: int) -> int:
    """The output layer's logits at once: a chunk of tokens (0: every response token of the rows)."""
    tokens = chunk_tokens if chunk_tokens > 0 else rows * row_tokens
    return math.ceil(SAFETY * LOGIT_COPIES * FLOAT * tokens * shape.vocab)


def micro_batch_bytes(shape: ModelShape, rows: int, row_tokens: int, *, chunk_tokens: int, checkpointing: bool) -> int:
    """Memory of one micro-batch's forward and backward beyond the fixed part."""
    per_token = token_bytes(shape, gradient_checkpointing=checkpointing)
    return rows * row_tokens * per_token + head_bytes(shape, chunk_tokens, row_tokens, rows)


def fitting_micro_batch(
    shape: ModelShape, budget: int, row_tokens: int, *, chunk_tokens: int, checkpointing: bool, fixed: int
) -> int:
    """The most rows of `row_tokens` tokens whose update fits `budget` bytes beside `fixed` (0: not one)."""
    per_row = row_tokens * token_bytes(shape, gradient_checkpointing=checkpointing)
    head = head_bytes(shape, chunk_tokens, row_tokens, 1)
    if chunk_tokens <= 0:  # unchunked logits grow with the rows
        per_row += head
        head = 0
    room = budget - fixed - head
    return max(0, room // per_row) if per_row > 0 else 0


def check_update_fits(
    shape: ModelShape,
    *,
    free: int,
    pending: int,
    engine_copy: bool,
    model_name: str,
    micro_batch_size: int | None,
    row_tokens: int | None,
    chunk_tokens: int,
    checkpointing: bool,
) -> None:
    """ConfigError, before the first step, when an update cannot fit `free` bytes: `pending` (what
    it still allocates for gradients and AdamW) plus the engine's copy, then (with a fixed
    `micro_batch_size` and the longest rows' `row_tokens`) one micro-batch beside them."""
    pending += FLOAT * shape.params if engine_copy else 0
    if pending > free:
        raise ConfigError(
            f"training {model_name} needs {gib(pending)} more for gradients, AdamW state"
            f"{' and the engine' if engine_copy else ''} but {gib(free)} is free; "
            "use algorithm.lora.enabled=true or a smaller model"
        )
    if micro_batch_size is None or row_tokens is None:
        return
    need = micro_batch_bytes(
        shape, micro_batch_size, row_tokens, chunk_tokens=chunk_tokens, checkpointing=checkpointing
    )
    if pending + need > free:
        fits = fitting_micro_batch(
            shape, free, row_tokens, chunk_tokens=chunk_tokens, checkpointing=checkpointing, fixed=pending
        )
        raise ConfigError(
            f"algorithm.micro_batch_size={micro_batch_size} needs ~{gib(need)} for rows of ~{row_tokens} tokens "
            f"beside {gib(pending)} for gradients and optimizer; {gib(free)} is free: "
            f"set algorithm.micro_batch_size=auto (or <= {fits}) or algorithm.gradient_checkpointing=true"
        )


def available_bytes(device: str = "cpu") -> int:
    """Free memory where the update runs: the accelerator's, or the machine's (MemAvailable)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not a POSIX system
        return 8 * GIB


def gib(size: float) -> str:
    return f"{size / GIB:.1f} GB"


def pending_bytes(shape: ModelShape, *, optimizer_started: bool) -> int:
    """What an update still allocates beyond what is in memory: gradients, and AdamW's moments
    until its first step has made them."""
    return FLOAT * shape.trainable * (1 + (0 if optimizer_started else ADAMW_STATES))


class AutoMicroBatch:
    """`algorithm.micro_batch_size: auto`: the most rows of a batch's width that fit `fraction` of
    the free memory of `device` (at least 1, at most the batch); each new choice is logged."""

    def __init__(self, device: str, *, fraction: float, chunk_tokens: int, checkpointing: bool) -> None:
        self.device = device
        self.fraction = fraction
        self.chunk_tokens = chunk_tokens
        self.checkpointing = checkpointing
        self._last: tuple[int, int] | None = None  # (row tokens, rows) last logged

    def rows(self, shape: ModelShape, batch_rows: int, row_tokens: int, *, fixed: int) -> int:
        """Rows per micro-batch of a batch of `batch_rows` rows `row_tokens` wide, beside `fixed` bytes."""
        budget = int(available_bytes(self.device) * self.fraction)
        rows = fitting_micro_batch(
            shape, budget, row_tokens, chunk_tokens=self.chunk_tokens, checkpointing=self.checkpointing, fixed=fixed
        )
        rows = max(1, min(rows, batch_rows))
        if self._last != (row_tokens, rows):
            self._last = (row_tokens, rows)
            logger.info("micro_batch_size auto: %d rows of %d tokens (%s free)", rows, row_tokens, gib(budget))
        return rows
