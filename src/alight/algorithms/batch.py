"""`TransitionBatch`: the one batch format every backend consumes (verl's DataProto idea).

Rows are transitions. Tensor names and layout mirror verl's, so the verl backend is a thin wrapper
(`DataProto.from_dict(batch.tensors(), non_tensors=batch.meta)`) and the embedded backend reads the
same fields:

- `input_ids` [B, P+R] int64: the prompt LEFT-padded to P, then the response RIGHT-padded to R
  (`prompts` and `responses` are its two column blocks); P and R are the batch's longest prompt
  and response, never a configured maximum.
- `attention_mask` [B, P+R] int64 (1 on real tokens); `position_ids` [B, P+R] int64 (verl's
  `cumsum(attention_mask) - 1` clipped at 0: 0 on left padding, 0, 1, 2, ... over real tokens,
  the last position repeated over right padding).
- `response_mask` [B, R] int64: 1 on tokens the loss covers (model-generated response tokens; in
  trajectory mode the inserted tool/user tokens are 0), 0 on padding.
- `old_log_probs` [B, R] float32 (0 where unknown or masked), `has_old_log_probs` [B] bool: rows
  whose transition carried no log-probs (re-tokenised calls) need the backend to compute them.
- `advantages` [B, R] float32: each row's advantage (`row_advantages` [B]; a transition without
  one counts as 0) over its `response_mask`; `rewards` [B] float32: each row's reward.
- `prompt_lengths`, `response_lengths` [B] int64: real tokens per row.
- `meta`: lists of length B: rollout_id, attempt_id, group_id, agent_name, step_index, span_id.
- `stale` [B] bool or None (none): rows served by weights older than those being updated (async
  training); `proximal_log_probs` [B, R] float32 or None: their log-probs under the weights before
  the update (the backend fills them), the decoupled-PPO anchor; fresh rows keep `old_log_probs`.

Stored: input_ids, the lengths, old log-probs, per-row advantages and rewards, and the response
mask of trajectory rows. `attention_mask`, `position_ids`, `advantages` (and a plain
`response_mask`) are computed from them on access: cheap, and small once a backend splits the
batch into micro-batches, so keep the result instead of asking twice. Built with numpy from flat id
arrays (no per-token Python loop; transitions holding numpy arrays are joined with one
`np.concatenate`) and handed to torch without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from alight.types import Transition

if TYPE_CHECKING:
    import torch

#: Per-row metadata lists every batch carries.
META_KEYS = ("rollout_id", "attempt_id", "group_id", "agent_name", "step_index", "span_id")

_ROW = attrgetter("prompt_ids", "response_ids", "response_logprobs", "response_mask", "advantage", "reward", *META_KEYS)


class TransitionBatch:
    """Padded tensors + masks + advantages + old log-probs + per-row metadata for B transitions."""

    def __init__(
        self,
        *,
        input_ids: torch.Tensor,
        prompt_lengths: torch.Tensor,
        response_lengths: torch.Tensor,
        old_log_probs: torch.Tensor,
        has_old_log_probs: torch.Tensor,
        row_advantages: torch.Tensor,
        rewards: torch.Tensor,
        meta: dict[str, list[Any]],
        pad_id: int,
        loss_mask: torch.Tensor | None = None,
        stale: torch.Tensor | None = None,
        proximal_log_probs: torch.Tensor | None = None,
    ) -> None:
        self.input_ids = input_ids
        self.prompt_lengths = prompt_lengths
        self.response_lengths = response_lengths
        self.old_log_probs = old_log_probs
        self.has_old_log_probs = has_old_log_probs
        self.row_advantages = row_advantages
        self.rewards = rewards
        self.meta = meta
        self.pad_id = pad_id
        self._loss_mask = loss_mask  # [B, R] when some row masks inserted tokens (trajectory mode)
        self.stale = stale
        self.proximal_log_probs = proximal_log_probs

    def mark_stale(self, rollout_ids: set[str] | frozenset[str]) -> None:
        """Mark the rows of these rollouts stale (served by older weights); none: `stale` stays None."""
        import torch

        rows = [rid in rollout_ids for rid in self.meta["rollout_id"]]
        self.stale = torch.tensor(rows, dtype=torch.bool) if any(rows) else None

    # -- shape ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        """R: the padded response width."""
        return int(self.old_log_probs.shape[1])

    @property
    def prompt_length(self) -> int:
        """P: the padded prompt width."""
        return int(self.input_ids.shape[1]) - self.response_length

    @property
    def prompts(self) -> torch.Tensor:
        """[B, P] left-padded prompt ids (a view of `input_ids`)."""
        return self.input_ids[:, : self.prompt_length]

    @property
    def responses(self) -> torch.Tensor:
        """[B, R] right-padded response ids (a view of `input_ids`)."""
        return self.input_ids[:, self.prompt_length :]

    # -- derived tensors --------------------------------------------------------------------------
    def _prompt_real(self) -> torch.Tensor:
        import torch

        p = self.prompt_length
        return torch.arange(p, device=self.input_ids.device) >= (p - self.prompt_lengths)[:, None]

    def _response_real(self) -> torch.Tensor:
        import torch

        return torch.arange(self.response_length, device=self.input_ids.device) < self.response_lengths[:, None]

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, P+R] int64: 1 on real prompt and response tokens, 0 on padding."""
        import torch

        return torch.cat([self._prompt_real(), self._response_real()], dim=1).long()

    @property
    def position_ids(self) -> torch.Tensor:
        """[B, P+R] int64: verl's `clip(cumsum(attention_mask) - 1, 0)`, without the row-wise cumsum."""
        import torch

        p, r, device = self.prompt_length, self.response_length, self.input_ids.device
        prompt = (torch.arange(p, device=device) - (p - self.prompt_lengths)[:, None]).clamp(min=0)
        last = (self.response_lengths - 1)[:, None]
        response = torch.minimum(torch.arange(r, device=device)[None, :], last) + self.prompt_lengths[:, None]
        return torch.cat([prompt, response], dim=1)

    @property
    def response_mask(self) -> torch.Tensor:
        """[B, R] int64: 1 on model-generated response tokens, 0 on inserted tokens and padding."""
        return self._response_real().long() if self._loss_mask is None else self._loss_mask

    @property
    def advantages(self) -> torch.Tensor:
        """[B, R] float32: each row's advantage on its `response_mask`, 0 elsewhere."""
        return self.row_advantages[:, None] * self.response_mask.to(self.row_advantages.dtype)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by its verl name: prompts, responses, input_ids, attention_mask, position_ids,
        response_mask, old_log_probs, has_old_log_probs, advantages, rewards (materialised now)."""
        response_mask = self.response_mask
        return {
            "prompts": self.prompts,
            "responses": self.responses,
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "response_mask": response_mask,
            "old_log_probs": self.old_log_probs,
            "has_old_log_probs": self.has_old_log_probs,
            "advantages": self.row_advantages[:, None] * response_mask.to(self.row_advantages.dtype),
            "rewards": self.rewards,
        }

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def from_transitions(cls, transitions: Sequence[Transition], pad_id: int) -> TransitionBatch:
        """A batch of `transitions` in order, padded with `pad_id` to the longest prompt and response.

        Raises:
            ValueError: no transitions, or a transition with an empty prompt or response.
        """
        b = len(transitions)
        if b == 0:
            raise ValueError("a TransitionBatch needs at least one transition")
        # One C-level pass reads every field; zip(*) turns the rows into columns.
        (prompts, responses, logprobs, masks, advantages, rewards, *meta_columns) = zip(
            *map(_ROW, transitions), strict=True
        )
        prompt_lens = np.fromiter(map(len, prompts), dtype=np.int64, count=b)
        response_lens = np.fromiter(map(len, responses), dtype=np.int64, count=b)
        if prompt_lens.min() == 0 or response_lens.min() == 0:
            raise ValueError("every transition needs a non-empty prompt and response")
        has_logprobs = np.fromiter((lp is not None for lp in logprobs), dtype=np.bool_, count=b)
        given = np.fromiter((mask is not None for mask in masks), dtype=np.bool_, count=b)
        return cls.from_flat(
            prompt_ids=_flat(prompts, np.int64, int(prompt_lens.sum())),
            prompt_lengths=prompt_lens,
            response_ids=_flat(responses, np.int64, int(response_lens.sum())),
            response_lengths=response_lens,
            logprobs=_flat(
                [lp for lp in logprobs if lp is not None], np.float32, int(response_lens[has_logprobs].sum())
            )
            if has_logprobs.any()
            else None,
            has_logprobs=has_logprobs,
            masks=_flat([m for m in masks if m is not None], np.int64, int(response_lens[given].sum()))
            if given.any()
            else None,
            has_mask=given,
            row_advantages=[0.0 if a is None else a for a in advantages],
            rewards=list(rewards),
            meta={key: list(column) for key, column in zip(META_KEYS, meta_columns, strict=True)},
            pad_id=pad_id,
        )

    @classmethod
    def from_flat(
        cls,
        *,
        prompt_ids: npt.NDArray[Any],
        prompt_lengths: npt.NDArray[np.int64],
        response_ids: npt.NDArray[Any],
        response_lengths: npt.NDArray[np.int64],
        logprobs: npt.NDArray[Any] | None,
        has_logprobs: npt.NDArray[np.bool_],
        row_advantages: Sequence[float] | npt.NDArray[np.float64],
        rewards: Sequence[float] | npt.NDArray[np.float64],
        meta: dict[str, list[Any]],
        pad_id: int,
        masks: npt.NDArray[Any] | None = None,
        has_mask: npt.NDArray[np.bool_] | None = None,
    ) -> TransitionBatch:
        """A batch from columns: B rows whose prompts (and responses) lie one after another in the
        flat `prompt_ids` (`response_ids`) with the given lengths; `logprobs` (`masks`) hold the
        log-probs (loss masks) of the rows marked in `has_logprobs` (`has_mask`) one after another.
        The same batch `from_transitions` makes of the same rows; lengths must be at least 1."""
        import torch

        b = len(prompt_lengths)
        if b == 0:
            raise ValueError("a TransitionBatch needs at least one transition")
        p, r = int(prompt_lengths.max()), int(response_lengths.max())
        prompt_real = np.arange(p) >= (p - prompt_lengths)[:, None]  # [B, P], left padding
        response_real = np.arange(r) < response_lengths[:, None]  # [B, R], right padding

        input_ids = np.full((b, p + r), pad_id, dtype=np.int64)
        input_ids[:, :p][prompt_real] = prompt_ids
        input_ids[:, p:][response_real] = response_ids

        loss_mask = None
        if masks is not None and has_mask is not None:
            loss_mask = response_real.astype(np.int64)
            loss_mask[response_real & has_mask[:, None]] = masks

        old_log_probs = np.zeros((b, r), dtype=np.float32)
        if logprobs is not None:
            old_log_probs[response_real & has_logprobs[:, None]] = logprobs
            if loss_mask is not None:
                old_log_probs *= loss_mask  # inserted (masked) tokens carry no log-prob

        return cls(
            input_ids=torch.from_numpy(input_ids),
            prompt_lengths=torch.from_numpy(np.ascontiguousarray(prompt_lengths, dtype=np.int64)),
            response_lengths=torch.from_numpy(np.ascontiguousarray(response_lengths, dtype=np.int64)),
            old_log_probs=torch.from_numpy(old_log_probs),
            has_old_log_probs=torch.from_numpy(np.ascontiguousarray(has_logprobs, dtype=np.bool_)),
            row_advantages=_float32(row_advantages),
            rewards=_float32(rewards),
            meta=meta,
            pad_id=pad_id,
            loss_mask=None if loss_mask is None else torch.from_numpy(loss_mask),
        )

    # -- slicing ----------------------------------------------------------------------------------
    def select(self, indices: Sequence[int] | torch.Tensor) -> TransitionBatch:
        """The rows at `indices`, in that order, with padding trimmed to their own longest prompt/response."""
        import torch

        index = torch.as_tensor(indices, dtype=torch.long)
        if index.numel() == 0:
            raise ValueError("select needs at least one index")
        p = self.prompt_length
        prompt_lengths = self.prompt_lengths.index_select(0, index)
        response_lengths = self.response_lengths.index_select(0, index)
        keep_p, keep_r = int(prompt_lengths.max()), int(response_lengths.max())
        rows = index.tolist()
        loss_mask = self._loss_mask
        return TransitionBatch(
            input_ids=self.input_ids.index_select(0, index)[:, p - keep_p : p + keep_r],
            prompt_lengths=prompt_lengths,
            response_lengths=response_lengths,
            old_log_probs=self.old_log_probs.index_select(0, index)[:, :keep_r],
            has_old_log_probs=self.has_old_log_probs.index_select(0, index),
            row_advantages=self.row_advantages.index_select(0, index),
            rewards=self.rewards.index_select(0, index),
            meta={key: [values[i] for i in rows] for key, values in self.meta.items()},
            pad_id=self.pad_id,
            loss_mask=None if loss_mask is None else loss_mask.index_select(0, index)[:, :keep_r],
            stale=None if self.stale is None else self.stale.index_select(0, index),
            proximal_log_probs=(
                None if self.proximal_log_probs is None else self.proximal_log_probs.index_select(0, index)[:, :keep_r]
            ),
        )

    def split(self, micro_batch_size: int) -> list[TransitionBatch]:
        """Consecutive micro-batches of at most `micro_batch_size` rows, each trimmed (see `select`)."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
        n = len(self)
        return [self.select(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]

    def to(self, device: str | torch.device) -> TransitionBatch:
        """The same batch with every tensor on `device` (metadata shared)."""
        return TransitionBatch(
            input_ids=self.input_ids.to(device),
            prompt_lengths=self.prompt_lengths.to(device),
            response_lengths=self.response_lengths.to(device),
            old_log_probs=self.old_log_probs.to(device),
            has_old_log_probs=self.has_old_log_probs.to(device),
            row_advantages=self.row_advantages.to(device),
            rewards=self.rewards.to(device),
            meta=self.meta,
            pad_id=self.pad_id,
            loss_mask=None if self._loss_mask is None else self._loss_mask.to(device),
            stale=None if self.stale is None else self.stale.to(device),
            proximal_log_probs=None if self.proximal_log_probs is None else self.proximal_log_probs.to(device),
        )

    def __repr__(self) -> str:
        shape = f"prompt_length={self.prompt_length}, response_length={self.response_length}"
        return f"TransitionBatch(rows={len(self)}, {shape})"


def _float32(values: Sequence[float] | npt.NDArray[np.float64]) -> torch.Tensor:
    """Values as a float32 tensor: lists as `torch.tensor` converts them, arrays rounded alike."""
    import torch

    if isinstance(values, np.ndarray):
        return torch.from_numpy(values.astype(np.float32))
    return torch.tensor(values, dtype=torch.float32)


def _flat(column: Sequence[Any], dtype: type[np.generic], count: int) -> npt.NDArray[Any]:
    """The sequences of `column` (lists or numpy arrays) one after another, as one array of `dtype`."""
    if column and set(map(type, column)) == {np.ndarray}:  # the store's arrays: one C-level copy
        return np.concatenate(column).astype(dtype, copy=False)
    return np.fromiter(chain.from_iterable(column), dtype=dtype, count=count)
