"""`TransitionBatch` <-> verl's `DataProto`, and the row padding verl's workers need.

`to_data_proto` hands verl a batch the way verl's own rollout leaves one before the update:

- tensors (verl's names, [B, ...]): prompts [B, P] (left-padded), responses [B, R] (right-padded),
  input_ids / attention_mask / position_ids [B, P+R] int64, response_mask [B, R] int64,
  old_log_probs [B, R] float32, advantages [B, R] float32 (LightningRL's, on the response mask),
  token_level_scores = token_level_rewards [B, R] float32 (the row's reward on its last
  loss-masked response token: where verl's GAE reads an outcome reward; alight's KL is a loss
  term, never folded into the reward), and alight's extras rewards [B] and has_old_log_probs [B];
- non-tensors (object arrays of length B): `uid` (the GRPO group: the row's group_id, or a uid of
  its own without one) and alight's metadata (rollout_id, attempt_id, group_id, ...);
- meta_info: `temperature`, which verl's engines read from every log-prob and update call.

verl's trainer then turns a DataProto into what its workers take with `to_tensordict` and
`left_right_2_no_padding` (`to_no_padding` here), and reads [B, R] results back with
`no_padding_2_padding`. Workers split a batch evenly over data-parallel ranks and mini-batches, so
`update_layout` picks the sizes and `pad_to_multiple` adds rows whose loss mask is 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from alight.algorithms.batch import META_KEYS, TransitionBatch

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict  # type: ignore[import-untyped]
    from verl import DataProto

#: Tensors that are 0 on the rows `pad_to_multiple(masked=True)` adds, so they carry no loss.
MASKED_ON_PADDING = ("response_mask", "advantages", "token_level_scores", "token_level_rewards")


def token_level_rewards(batch: TransitionBatch) -> torch.Tensor:
    """[B, R] float32: each row's reward on its last response token the loss sees, 0 elsewhere
    (a row whose response mask is all 0 gets none)."""
    import torch

    mask = batch.response_mask
    r = mask.shape[1]
    # Index of the last 1 in each row: the largest position among the masked ones.
    last = (torch.arange(r, device=mask.device)[None, :] * mask).argmax(dim=1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has_token = mask.sum(dim=1) > 0
    rows = torch.arange(len(batch), device=mask.device)[has_token]
    out[rows, last[has_token]] = batch.rewards.to(torch.float32)[has_token]
    return out


def uids(batch: TransitionBatch) -> list[str]:
    """verl's `uid` per row: the row's group_id; a row without one is a group of its own."""
    return [f"group:{g}" if g is not None else f"row:{i}" for i, g in enumerate(batch.meta["group_id"])]


def to_data_proto(batch: TransitionBatch, *, temperature: float = 1.0) -> DataProto:
    """The batch as a verl `DataProto` (see the module docstring for its keys).

    `temperature` is the one log-probs are computed at (`config.logprob_temperature`); it must be
    positive, since verl divides the logits by it.
    """
    import numpy as np
    from verl import DataProto

    if temperature <= 0:
        raise ValueError(f"temperature must be positive (greedy sampling means 1.0), got {temperature}")
    tensors = batch.tensors()
    # prompts/responses are views of input_ids: own copies, so shipping one key ships no other.
    tensors["prompts"] = tensors["prompts"].contiguous()
    tensors["responses"] = tensors["responses"].contiguous()
    rewards = token_level_rewards(batch)
    tensors["token_level_scores"] = rewards
    tensors["token_level_rewards"] = rewards.clone()
    non_tensors: dict[str, Any] = {"uid": np.array(uids(batch), dtype=object)}
    for key in META_KEYS:
        column = np.empty(len(batch), dtype=object)
        column[:] = batch.meta[key]
        non_tensors[key] = column
    data: DataProto = DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info={"temperature": float(temperature)}
    )
    return data


def update_layout(
    rows: int, mini_batch_size: int | None, world_size: int, micro_batch_size: int = 1
) -> tuple[int, int]:
    """(rows per optimizer step, rows after padding) for an update of `rows` transitions.

    verl's `train_mini_batch` splits a step's rows evenly over the data-parallel ranks, and with
    fixed micro-batches (no dynamic batch size) asserts that each rank's share of a step divides
    by `micro_batch_size` (`micro_batch_size_per_gpu`): so the step size is alight's
    `mini_batch_size` (None: all rows) rounded up to a multiple of `world_size * micro_batch_size`,
    and the batch is padded to a multiple of it.
    """
    if rows < 1 or world_size < 1 or micro_batch_size < 1:
        raise ValueError(
            f"rows, world_size and micro_batch_size must be at least 1, got {rows}, {world_size}, {micro_batch_size}"
        )
    unit = world_size * micro_batch_size
    mini = min(mini_batch_size or rows, rows)
    mini = math.ceil(mini / unit) * unit
    return mini, math.ceil(rows / mini) * mini


def pad_to_multiple(data: DataProto, k: int, *, masked: bool = True) -> tuple[DataProto, int]:
    """`data` padded to a multiple of `k` rows by repeating its first rows (verl's
    `pad_dataproto_to_divisor`), and the number of rows added.

    With `masked` (for updates) the added rows' response_mask, advantages and token rewards are 0,
    so a token-mean loss is unchanged; seq-mean losses divide by rows, padding included. Without
    it (for log-prob and value passes) their outputs are dropped (`unpad`). Either way an added
    row keeps 2 tokens (`shrink_rows`): verl drops padding tokens before the forward pass, so a
    batch padded to whole micro-batches costs little more than the rows it really has.
    """
    from verl.protocol import pad_dataproto_to_divisor

    padded, pad_size = pad_dataproto_to_divisor(data, k)
    if pad_size:
        shrink_rows(padded.batch, slice(len(padded) - pad_size, None))
        if masked:
            for key in MASKED_ON_PADDING:
                if key in padded.batch:
                    padded.batch[key][-pad_size:] = 0
    return padded, pad_size


def shrink_rows(tensors: Any, rows: slice) -> None:
    """Leave `rows` 2 real tokens, the prompt's last and the response's first (attention_mask,
    position_ids 0 and 1, response_mask on that one response token); needs `responses`."""
    if "responses" not in tensors or "attention_mask" not in tensors:
        return
    attention = tensors["attention_mask"]
    prompt_width = attention.shape[1] - tensors["responses"].shape[1]
    attention[rows] = 0
    attention[rows, prompt_width - 1 : prompt_width + 1] = 1
    if "position_ids" in tensors and tensors["position_ids"].dim() == 2:
        positions = tensors["position_ids"]
        positions[rows] = 0
        positions[rows, prompt_width] = 1
    if "response_mask" in tensors:
        tensors["response_mask"][rows] = 0
        tensors["response_mask"][rows, 0] = 1


def unpad(data: DataProto, pad_size: int) -> DataProto:
    """The first rows of `data`, without the `pad_size` rows `pad_to_multiple` added."""
    from verl.protocol import unpad_dataproto

    kept: DataProto = unpad_dataproto(data, pad_size)
    return kept


def response_values(data: DataProto, key: str, *, pad_size: int = 0) -> torch.Tensor:
    """[B, R] float32 copy of `data`'s tensor `key` (old_log_probs, ref_log_prob, values,
    advantages, returns ...), the `pad_size` padded rows dropped."""
    import torch

    values: torch.Tensor = data.batch[key]
    if values.dim() != 2:
        raise ValueError(f"{key} is not a [B, R] tensor: shape {tuple(values.shape)}")
    rows = values.shape[0] - pad_size
    return values[:rows].to(torch.float32).clone()


def to_no_padding(data: DataProto) -> TensorDict:
    """What verl's trainer hands its workers: the DataProto as a TensorDict, input_ids and
    position_ids as jagged tensors of the real tokens (`left_right_2_no_padding`), meta_info as
    non-tensor entries. Needs tensordict >= 0.10 (verl's `to_tensordict` asserts it)."""
    from verl.workers.utils.padding import left_right_2_no_padding

    return left_right_2_no_padding(data.to_tensordict())


def worker_input(
    data: DataProto, keys: tuple[str, ...], multiple: int, meta: dict[str, Any], *, temperature: float, masked: bool
) -> TensorDict:
    """What verl's workers take: the tensors `keys` of `data` padded to a multiple of `multiple`
    rows (`masked`: rows with no loss), in verl's no-padding TensorDict layout, with `meta` and
    the log-prob `temperature` as non-tensor data. (Built from the tensors alone: workers need no
    per-row metadata, and verl's `DataProto.to_tensordict` wants tensordict >= 0.10.)"""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    padded, _ = pad_to_multiple(data.select(batch_keys=list(keys), non_tensor_batch_keys=[]), multiple, masked=masked)
    tensors: dict[str, Any] = {key: padded.batch[key] for key in keys}
    inputs = tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={"temperature": temperature, **meta})
    return left_right_2_no_padding(inputs)


def update_meta(mini: int, epochs: int, seed: int, shuffle: bool) -> dict[str, Any]:
    """The non-tensor data verl's `train_mini_batch` reads (as verl's trainer sets it)."""
    return {
        "global_batch_size": mini,
        "mini_batch_size": mini,
        "epochs": epochs,
        "seed": seed,
        "dataloader_kwargs": {"shuffle": shuffle},
    }
