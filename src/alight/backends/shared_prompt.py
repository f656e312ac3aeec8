"""A prompt that several rows of a batch share, computed once (the samples of a GRPO group).

The n samples of a GRPO group answer one prompt, so one forward over the batch's `input_ids`
computes each prompt n times. Here the distinct prompts run once, as a [G, P] batch left-padded
like the batch's prompts, with the decoder's key/value cache kept; the cache is repeated for the
rows that share each prompt (an `index_select`, so backward sums each row's gradient into the
prompt's one computation) and the [B, R] responses run on it. The values are the one forward's: a
prompt token never attends to a response token, and the positions and attention mask are the
batch's own. With groups of 8 and prompts longer than responses this is most of an update's tokens.

It needs the decoder's cache in training, so it is not used with gradient checkpointing (which
turns the cache off), nor for a cache that is not plain full-attention layers (sliding windows,
recurrent state), nor when no two rows share a prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from alight.algorithms.batch import TransitionBatch


def prompt_groups(batch: TransitionBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the first row of each distinct prompt [G], each row's prompt index into them [B]), or None
    when no two rows share a prompt. Rows share a prompt when their prompt ids and lengths are equal."""
    import torch

    rows = len(batch)
    if rows < 2:
        return None
    keys = torch.cat([batch.prompts, batch.prompt_lengths[:, None].to(batch.prompts.dtype)], dim=1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    distinct = int(inverse.max()) + 1
    if distinct == rows:
        return None
    order = torch.arange(rows, device=inverse.device)
    first = torch.full((distinct,), rows, dtype=order.dtype, device=inverse.device)
    return first.scatter_reduce(0, inverse, order, reduce="amin"), inverse


def shareable(model: Any) -> bool:
    """Whether `model`'s decoder keeps a plain key/value cache in training (see the module docstring)."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers 5.x's name
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        return False
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return False
    return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)


def response_hidden(decoder: Any, batch: TransitionBatch) -> torch.Tensor | None:
    """[B, R, H]: the decoder's last hidden states that predict each response token (those at
    positions P-1 .. P+R-2 of one forward over `input_ids`), with each distinct prompt computed
    once; None when no two rows share a prompt (or the cache is not plain layers: nothing computed)."""
    import torch
    from transformers.cache_utils import DynamicLayer

    groups = prompt_groups(batch)
    if groups is None:
        return None
    first, row_prompt = groups
    width = batch.prompt_length
    mask, positions = batch.attention_mask, batch.position_ids
    prompt = decoder(
        input_ids=batch.prompts.index_select(0, first),
        attention_mask=mask.index_select(0, first)[:, :width],
        position_ids=positions.index_select(0, first)[:, :width],
        use_cache=True,
    )
    cache = prompt.past_key_values
    if any(type(layer) is not DynamicLayer for layer in getattr(cache, "layers", [None])):
        return None
    cache.reorder_cache(row_prompt)  # [G, ...] -> [B, ...]: each row's prompt (autograd sums the repeats)
    response = decoder(
        input_ids=batch.responses,
        attention_mask=mask,
        position_ids=positions[:, width:],
        past_key_values=cache,
        use_cache=True,
    )
    last_prompt = prompt.last_hidden_state[:, -1:].index_select(0, row_prompt)  # predicts the first response token
    return torch.cat([last_prompt, response.last_hidden_state[:, :-1]], dim=1)
