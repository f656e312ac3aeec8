"""Prompt tokens several rows of a batch share, computed once: a GRPO group's prompt, a system prompt.

The n samples of a GRPO group answer one prompt, and most prompts of an agent start with the same
system prompt and tool list, so one forward over the batch's `input_ids` computes the same tokens
many times. Here, with the decoder's key/value cache kept between three forwards:

1. the prefix every distinct prompt starts with, once ([1, c]; when it is `MIN_SHARED_PREFIX`
   tokens or more), its cache repeated for each distinct prompt;
2. the rest of each distinct prompt, once ([G, W], left-padded), its cache repeated for the rows
   that share it;
3. the responses of every row ([B, R]).

Repeating is an `index_select`, so backward sums each row's gradient into the shared computation.
The values are those of one forward: a token attends to the same tokens at the same positions (a
prompt never attends to a response, the attention mask drops the padding between the parts). With
groups of 8 and prompts longer than responses this is most of an update's tokens, and a warm
start's demonstrations share their system prompt.

It needs the decoder's cache in training, so it is not used with gradient checkpointing (which
turns the cache off), nor for a cache that is not plain full-attention layers (sliding windows,
recurrent state), nor when there is nothing to share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from alight.algorithms.batch import TransitionBatch

#: The shortest prefix of every distinct prompt worth a forward of its own (fewer tokens: none).
MIN_SHARED_PREFIX = 16


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


def common_prefix(prompts: torch.Tensor, lengths: torch.Tensor) -> int:
    """How many leading real tokens every left-padded prompt row shares (a system prompt, a tool
    list), at most the shortest prompt's length minus one: each row keeps a token of its own."""
    import torch

    width, shortest = prompts.shape[1], int(lengths.min())
    if len(prompts) < 2 or shortest < 2:
        return 0
    starts = width - lengths  # each row's first real column
    columns = starts[:, None] + torch.arange(shortest - 1, device=prompts.device)
    heads = prompts.gather(1, columns)  # [G, shortest - 1]: every row's first tokens
    same = (heads == heads[:1]).all(0).long()
    return int(same.cumprod(0).sum())


def _suffixes(prompts: torch.Tensor, lengths: torch.Tensor, shared: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, position ids) of each prompt's tokens after the first `shared`,
    left-padded to the longest such suffix: [G, W] each."""
    import torch

    own = lengths - shared  # >= 1 (common_prefix leaves each row a token)
    width = int(own.max())
    column = torch.arange(width, device=prompts.device)
    pads = width - own  # left padding of each row
    real = column[None, :] >= pads[:, None]
    source = (prompts.shape[1] - own)[:, None] + (column[None, :] - pads[:, None])  # the prompt column it copies
    ids = torch.where(real, prompts.gather(1, source.clamp(0, prompts.shape[1] - 1)), prompts[:, :1])
    positions = torch.where(real, shared + column[None, :] - pads[:, None], 0)
    return ids, real.long(), positions


def response_hidden(decoder: Any, batch: TransitionBatch) -> torch.Tensor | None:
    """[B, R, H]: the decoder's last hidden states that predict each response token (those at
    positions P-1 .. P+R-2 of one forward over `input_ids`), with each distinct prompt computed
    once, and the prefix all of them share (at least `MIN_SHARED_PREFIX` tokens) once before them;
    None when there is nothing to share (or the cache is not plain layers)."""
    import torch

    groups = prompt_groups(batch)
    rows = torch.arange(len(batch), device=batch.input_ids.device)
    first, row_prompt = groups if groups is not None else (rows, rows)
    prompts, lengths = batch.prompts.index_select(0, first), batch.prompt_lengths.index_select(0, first)
    shared = common_prefix(prompts, lengths)
    if shared < MIN_SHARED_PREFIX:
        shared = 0
        if groups is None:
            return None
    cache = None
    if shared:  # the prefix once, its cache repeated for each distinct prompt
        start = int(batch.prompt_length - lengths[0])
        prefix = prompts[:1, start : start + shared]
        ones = torch.ones_like(prefix)
        out = decoder(input_ids=prefix, attention_mask=ones, position_ids=ones.cumsum(1) - 1, use_cache=True)
        cache = out.past_key_values
        if not _plain(cache):
            return None
        cache.reorder_cache(torch.zeros(len(first), dtype=torch.long, device=prefix.device))
    ids, suffix_mask, positions = _suffixes(prompts, lengths, shared)
    prompt_mask = torch.cat([suffix_mask.new_ones(len(first), shared), suffix_mask], dim=1)
    prompt = decoder(
        input_ids=ids, attention_mask=prompt_mask, position_ids=positions, past_key_values=cache, use_cache=True
    )
    cache = prompt.past_key_values
    if not _plain(cache):
        return None
    cache.reorder_cache(row_prompt)  # [G, ...] -> [B, ...]: each row's prompt (autograd sums the repeats)
    response_real = batch.attention_mask[:, batch.prompt_length :]
    response = decoder(
        input_ids=batch.responses,
        attention_mask=torch.cat([prompt_mask.index_select(0, row_prompt), response_real], dim=1),
        position_ids=batch.position_ids[:, batch.prompt_length :],
        past_key_values=cache,
        use_cache=True,
    )
    last_prompt = prompt.last_hidden_state[:, -1:].index_select(0, row_prompt)  # predicts the first response token
    return torch.cat([last_prompt, response.last_hidden_state[:, :-1]], dim=1)


def _plain(cache: Any) -> bool:
    """Whether `cache` is plain full-attention layers (their rows can be repeated)."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))
