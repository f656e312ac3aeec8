"""Prompt tokens several rows of a batch share, computed once: a GRPO group's prompt, a system prompt.

The n samples of a GRPO group answer one prompt, and most prompts of an agent start with the same
system prompt and tool list, so one forward over the batch's `input_ids` computes the same tokens
many times. Here, with the decoder's key/value cache kept between three forwards:

1. the prefix every distinct prompt starts with, once ([1, c]; when it is `MIN_SHARED_PREFIX`
   tokens or more), its cache repeated for each distinct prompt;
2. the rest of each distinct prompt, once ([G, W], left-padded), its cache repeated for the rows
   that share it;
3. the responses of every row, in up to `MAX_BUCKETS` forwards of rows of similar length, each
   padded to its own longest response (`response_buckets`) rather than the batch's.

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

from alight.engines.sampling import plain_layers

if TYPE_CHECKING:
    import torch

    from alight.algorithms.batch import TransitionBatch

#: The shortest prefix of every distinct prompt worth a forward of its own (fewer tokens: none).
MIN_SHARED_PREFIX = 16
#: The responses run in at most this many forwards, rows grouped by length (`response_buckets`) ...
MAX_BUCKETS = 4
#: ... each forward counted as this many tokens of work when choosing the groups.
BUCKET_OVERHEAD = 32


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
        if not plain_layers(cache):
            return None
        cache.reorder_cache(torch.zeros(len(first), dtype=torch.long, device=prefix.device))
    ids, suffix_mask, positions = _suffixes(prompts, lengths, shared)
    prompt_mask = torch.cat([suffix_mask.new_ones(len(first), shared), suffix_mask], dim=1)
    prompt = decoder(
        input_ids=ids, attention_mask=prompt_mask, position_ids=positions, past_key_values=cache, use_cache=True
    )
    cache = prompt.past_key_values
    if not plain_layers(cache):
        return None
    last_prompt = prompt.last_hidden_state[:, -1:]  # predicts each prompt's first response token
    response_real = batch.attention_mask[:, batch.prompt_length :]
    response_positions = batch.position_ids[:, batch.prompt_length :]
    width = batch.response_length
    parts, order = [], []
    for bucket in response_buckets(batch.response_lengths.tolist()):
        rows_in = torch.tensor(bucket, device=rows.device)
        own = row_prompt.index_select(0, rows_in)
        longest = max(1, int(batch.response_lengths.index_select(0, rows_in).max()))
        response = decoder(  # on each row's prompt cache (repeated: autograd sums the repeats)
            input_ids=batch.responses.index_select(0, rows_in)[:, :longest],
            attention_mask=torch.cat(
                [prompt_mask.index_select(0, own), response_real.index_select(0, rows_in)[:, :longest]], dim=1
            ),
            position_ids=response_positions.index_select(0, rows_in)[:, :longest],
            past_key_values=_repeated(cache, own),
            use_cache=True,
        )
        hidden = torch.cat([last_prompt.index_select(0, own), response.last_hidden_state[:, : longest - 1]], dim=1)
        parts.append(torch.nn.functional.pad(hidden, (0, 0, 0, width - longest)))  # zeros past the bucket's longest
        order += bucket
    back = torch.empty_like(rows)
    back[torch.tensor(order, device=rows.device)] = rows
    return torch.cat(parts).index_select(0, back)


def response_buckets(
    lengths: list[int], *, most: int = MAX_BUCKETS, overhead: int = BUCKET_OVERHEAD
) -> list[list[int]]:
    """The rows grouped by response length, each group padded to its own longest response: at most
    `most` groups of consecutive lengths, chosen to compute the fewest tokens (rows x the group's
    longest) counting `overhead` tokens for each group's forward. Rows of a group keep their order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sorted_lengths = [max(1, lengths[i]) for i in order]
    n = len(order)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(most + 1)]  # best[k][j]: the first j rows in k groups
    cut = [[0] * (n + 1) for _ in range(most + 1)]  # where the k-th group of the first j rows starts
    best[0][0] = 0.0
    for k in range(1, most + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):
                cost = best[k - 1][i] + (j - i) * sorted_lengths[j - 1] + overhead
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    groups = min(range(1, most + 1), key=lambda k: best[k][n]) if n else 0
    found, end = [], n
    for k in range(groups, 0, -1):
        start = cut[k][end]
        found.append(sorted(order[start:end]))
        end = start
    return found[::-1]


def _repeated(cache: Any, index: torch.Tensor) -> Any:
    """A new cache whose rows are `cache`'s rows `index` (plain layers; `cache` is left as it is)."""
    from transformers.cache_utils import DynamicCache

    return DynamicCache(
        [(layer.keys.index_select(0, index), layer.values.index_select(0, index)) for layer in cache.layers]
    )
