"""The embedded engine's batched sampling loop: one prefill, then one cached forward per token.

Prompts of different lengths are left-padded into one batch with an attention mask and explicit
position ids, so each row computes what it would compute alone. Every row has its own sampling
settings and random generator, so batching changes neither seeded nor greedy results (up to
float rounding of padded kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch


@dataclass
class Sequence:
    """One row of a batch: a prompt and how to continue it."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    generator: torch.Generator | None = None  # None: torch's global generator
    on_text: Callable[[str], None] | None = None  # streaming: gets the settled text after each token but the last
    cancelled: bool = False  # set from another thread when the caller has gone: the row stops at the next token


@dataclass
class SequenceOutput:
    token_ids: list[int]  # generated ids; the end-of-turn token is included when generated
    logprobs: list[float]  # one per token id
    text: str  # decoded text: end-of-turn token excluded, cut before a stop string
    finish_reason: Literal["stop", "length"]


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-size:]):
                longest = size
                break
    return longest


def _cut_at_stop(text: str, stops: list[str]) -> str | None:
    """Text before the first stop string, None when none occurs."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return text[: min(hits)] if hits else None


def _pick(logits: torch.Tensor, seq: Sequence) -> tuple[int, float]:
    """Sample (or take the argmax of) one row of logits; returns the token and its log-prob.

    The log-prob is log_softmax(logits / T) at the token with T = temperature (T = 1 for greedy),
    over the full vocabulary: top-p filtering changes what can be drawn, not the recorded value."""
    import torch

    if seq.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / seq.temperature, dim=-1)
    probs = logp.exp()
    if seq.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= seq.top_p  # keep the smallest nucleus
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    token = int(torch.multinomial(probs, 1, generator=seq.generator))
    return token, float(logp[token])


def generate(
    model: Any,
    batch: list[Sequence],
    *,
    pad_id: int,
    eos_ids: set[int],
    decode: Callable[[list[int]], str],
) -> list[SequenceOutput]:
    """Continue every sequence of the batch until it ends, hits a stop string or its token limit."""
    import torch

    device = next(model.parameters()).device
    width = max(len(s.prompt_ids) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, seq in enumerate(batch):
        ids[row, width - len(seq.prompt_ids) :] = torch.tensor(seq.prompt_ids, dtype=torch.long)
        mask[row, width - len(seq.prompt_ids) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    tokens: list[list[int]] = [[] for _ in batch]
    logprobs: list[list[float]] = [[] for _ in batch]
    texts: list[str | None] = [None] * len(batch)
    finish: list[Literal["stop", "length"] | None] = [None] * len(batch)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        positions = positions[:, -1:]
        for _step in range(max(s.max_new_tokens for s in batch)):
            logits = out.logits[:, -1, :].float()
            next_ids = []
            for row, seq in enumerate(batch):
                if finish[row] is None and seq.cancelled:
                    finish[row] = "length"
                if finish[row] is not None:
                    next_ids.append(pad_id)
                    continue
                token, logprob = _pick(logits[row], seq)
                tokens[row].append(token)
                logprobs[row].append(logprob)
                next_ids.append(token)
                finish[row], texts[row] = _after_token(seq, tokens[row], eos_ids, decode)
            if all(f is not None for f in finish):
                break
            mask = torch.cat([mask, mask.new_ones((len(batch), 1))], dim=1)
            positions = positions + 1
            step_ids = torch.tensor(next_ids, dtype=torch.long, device=device)[:, None]
            out = model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    results = []
    for row in range(len(batch)):
        text = texts[row]
        if text is None:
            text = decode([t for t in tokens[row] if t not in eos_ids])
        results.append(SequenceOutput(tokens[row], logprobs[row], text, finish[row] or "length"))
    return results


def _after_token(
    seq: Sequence, tokens: list[int], eos_ids: set[int], decode: Callable[[list[int]], str]
) -> tuple[Literal["stop", "length"] | None, str | None]:
    """Whether the sequence ends after its newest token, and its final text when it does."""
    if tokens[-1] in eos_ids:
        return "stop", decode(tokens[:-1])
    if not seq.stop and seq.on_text is None:
        return ("length" if len(tokens) >= seq.max_new_tokens else None), None
    text = decode(tokens)
    cut = _cut_at_stop(text, seq.stop)
    if cut is not None:
        return "stop", cut
    if len(tokens) >= seq.max_new_tokens:
        return "length", text
    if seq.on_text is not None and not text.endswith("\ufffd"):  # an unfinished UTF-8 character waits
        seq.on_text(text[: len(text) - _held_back(text, seq.stop)])
    return None, None
