"""The embedded engine's batched sampling loop: prefills, then one cached forward per token.

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


@dataclass
class _Row:
    seq: Sequence
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class Decoder:
    """A running batch that sequences join and leave one token at a time (continuous batching).

    `add` prefills new sequences together and merges their key/value cache into the running one
    (both left-padded to one length); `step` samples one token for every row, hands back the rows
    that ended, drops them from the batch and runs one cached forward for the others. Each row
    keeps its attention mask and position ids, so it computes what it would compute alone (up to
    float rounding of padded kernels), whoever shares the batch. Models whose cache is not plain
    full-attention layers (sliding windows, recurrent state) cannot merge: `can_join` is False
    once such a batch runs, and new sequences wait until it ends.
    """

    def __init__(self, model: Any, *, pad_id: int, eos_ids: set[int], decode: Callable[[list[int]], str]) -> None:
        self._model, self._pad_id, self._eos_ids, self._decode = model, pad_id, eos_ids, decode
        self._device = next(model.parameters()).device
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [rows, cache length]: 1 where a row has a token
        self._positions: torch.Tensor | None = None  # [rows, 1]: the position of each row's newest token
        self._logits: torch.Tensor | None = None  # [rows, vocab]: each row's next-token logits
        self.forwards = 0  # forward passes run (prefills and decode steps)
        self._merges = False  # whether the running cache's layers can merge (see `plain_layers`)

    @property
    def size(self) -> int:
        """Rows still generating."""
        return len(self._rows)

    @property
    def can_join(self) -> bool:
        """Whether new sequences can join the running rows now."""
        return not self._rows or self._merges

    def add(self, batch: list[Sequence]) -> None:
        """Prefill `batch` (left-padded together) and let its rows join the running ones."""
        import torch

        if not batch:
            return
        if not self.can_join:
            raise RuntimeError("this model's cache cannot merge batches: add only when the decoder is empty")
        width = max(len(s.prompt_ids) for s in batch)
        ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, width - len(seq.prompt_ids) :] = torch.tensor(seq.prompt_ids, dtype=torch.long)
            mask[row, width - len(seq.prompt_ids) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = self._model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
            )
        self.forwards += 1
        logits = out.logits[:, -1, :].float()
        rows = [_Row(seq) for seq in batch]
        if not self._rows:
            self._cache, self._mask, self._logits = out.past_key_values, mask, logits
            self._merges = plain_layers(self._cache)  # the same kind of cache until the batch ends
            self._positions = positions[:, -1:]
        else:
            assert self._mask is not None and self._positions is not None and self._logits is not None
            length = max(self._mask.shape[1], width)
            _merge_caches(self._cache, out.past_key_values, length)
            self._mask = torch.cat([_left_pad(self._mask, length, 1), _left_pad(mask, length, 1)])
            self._positions = torch.cat([self._positions, positions[:, -1:]])
            self._logits = torch.cat([self._logits, logits])
        self._rows.extend(rows)

    def step(self) -> list[tuple[Sequence, SequenceOutput]]:
        """One token for every row; returns the rows that ended (and leave the batch) with their outputs."""
        import torch

        if not self._rows:
            return []
        assert self._mask is not None and self._positions is not None and self._logits is not None
        ended: list[tuple[Sequence, SequenceOutput]] = []
        keep: list[int] = []
        next_ids: list[int] = []
        for index, row in enumerate(self._rows):
            seq = row.seq
            if seq.cancelled:  # the caller has gone
                ended.append((seq, self._output(row, "length", None)))
                continue
            token, logprob = _pick(self._logits[index], seq)
            row.tokens.append(token)
            row.logprobs.append(logprob)
            finish, text = _after_token(seq, row.tokens, self._eos_ids, self._decode)
            if finish is not None:
                ended.append((seq, self._output(row, finish, text)))
            else:
                keep.append(index)
                next_ids.append(token)
        if not keep:
            self._rows, self._cache, self._mask, self._positions, self._logits = [], None, None, None, None
            return ended
        mask, positions = self._mask, self._positions
        if len(keep) < len(self._rows):  # ended rows leave, and padding no row needs any more goes
            kept = torch.tensor(keep, device=self._device)
            mask, positions = mask[kept], positions[kept]
            if self._merges:
                first = int((mask.sum(0) > 0).nonzero()[0])
                _select_cache(self._cache, kept, first)
                mask = mask[:, first:]
            else:  # a sliding window's or a recurrent state's own bookkeeping: HF's selection
                self._cache.batch_select_indices(kept)
            self._rows = [self._rows[i] for i in keep]
        mask = torch.cat([mask, mask.new_ones((len(keep), 1))], dim=1)
        positions = positions + 1
        step_ids = torch.tensor(next_ids, dtype=torch.long, device=self._device)[:, None]
        with torch.inference_mode():
            out = self._model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
            )
        self.forwards += 1
        self._cache, self._mask, self._positions = out.past_key_values, mask, positions
        self._logits = out.logits[:, -1, :].float()
        return ended

    def fail(self) -> list[Sequence]:
        """Drop every row (after an error); returns their sequences."""
        failed = [row.seq for row in self._rows]
        self._rows, self._cache, self._mask, self._positions, self._logits = [], None, None, None, None
        return failed

    def _output(self, row: _Row, finish: Literal["stop", "length"], text: str | None) -> SequenceOutput:
        if text is None:
            text = self._decode([t for t in row.tokens if t not in self._eos_ids])
        return SequenceOutput(row.tokens, row.logprobs, text, finish)


def plain_layers(cache: Any) -> bool:
    """Whether `cache` is plain full-attention key/value layers (that left-padding can merge and an
    index can repeat: the engine's continuous batching, the backend's shared prompts)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros before it along `dim` up to `length`."""
    import torch

    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _merge_caches(running: Any, joining: Any, length: int) -> None:
    """Append `joining`'s rows to `running` (in place), both left-padded to `length` positions."""
    import torch

    for mine, theirs in zip(running.layers, joining.layers, strict=True):
        mine.keys = torch.cat([_left_pad(mine.keys, length, 2), _left_pad(theirs.keys, length, 2)])
        mine.values = torch.cat([_left_pad(mine.values, length, 2), _left_pad(theirs.values, length, 2)])


def _select_cache(cache: Any, rows: torch.Tensor, first: int) -> None:
    """Keep `rows` of `cache` (in place), from position `first` on."""
    for layer in cache.layers:
        layer.keys = layer.keys[rows, :, first:]
        layer.values = layer.values[rows, :, first:]


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
