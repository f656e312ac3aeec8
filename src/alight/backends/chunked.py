"""Response-token log-probs without the full-vocabulary logits of a whole micro-batch.

The plain way (`losses.token_log_probs` over the model's logits) holds [B, R, V] fp32 logits, their
log-softmax and their gradients at once: ~2 GB per micro-batch of 32 calc rows with a 49k-token
vocabulary. Here the model runs up to its last hidden states, and the output layer, log-softmax,
gather (and entropy) run on chunks of at most `chunk_tokens` masked tokens, each under
`torch.utils.checkpoint`, so backward recomputes one chunk's logits at a time. Same formulas
(`losses.token_log_probs`, `losses.entropy`), same values; only the order of the work changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alight.backends import losses, shared_prompt

if TYPE_CHECKING:
    import torch

    from alight.algorithms.batch import TransitionBatch

#: Config attributes of model families whose logits are not just the output layer's (softcapping,
#: scaling): the chunked path would compute something else, so they take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunked_head_supported(model: Any) -> bool:
    """Whether `model`'s logits are its output layer applied to its decoder's last hidden states."""
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def head_log_probs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([B, R] log p(target), [B, R] entropy or None) from hidden states [B, R, H] that predict
    `targets` [B, R] through `head` (the output layer), computed on the tokens where `mask` is 1, in
    chunks of at most `chunk_tokens`; 0 where `mask` is 0. With gradients enabled each chunk runs
    under activation checkpointing: the graph keeps only `hidden`, never a chunk's logits."""
    import torch
    from torch.utils.checkpoint import checkpoint

    rows, length = targets.shape
    where = mask.reshape(-1).nonzero().squeeze(-1)
    flat_hidden = hidden.reshape(rows * length, -1).index_select(0, where)
    flat_targets = targets.reshape(-1).index_select(0, where)
    grad = torch.is_grad_enabled() and hidden.requires_grad

    def chunk(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.is_autocast_enabled(h.device.type):  # bf16 decoder: the output layer stays float32
            with torch.autocast(device_type=h.device.type, enabled=False):
                logits = head(h.float())[None]
        else:
            logits = head(h)[None]  # [1, n, V]: the loss functions' [B, R, V] layout
        if with_entropy:
            lp, ent = losses.log_probs_and_entropy(logits, t[None], temperature)
            return lp[0], ent[0]
        lp = losses.token_log_probs(logits, t[None], temperature)[0]
        return lp, lp.new_zeros(())

    parts_lp, parts_ent = [], []
    size = max(1, chunk_tokens) if chunk_tokens > 0 else max(1, flat_targets.numel())
    for start in range(0, flat_targets.numel(), size):
        h, t = flat_hidden[start : start + size], flat_targets[start : start + size]
        lp, ent = checkpoint(chunk, h, t, use_reentrant=False) if grad else chunk(h, t)
        parts_lp.append(lp)
        parts_ent.append(ent)
    out_lp = hidden.new_zeros(rows * length, dtype=torch.float32)
    if parts_lp:
        out_lp = out_lp.index_put((where,), torch.cat(parts_lp))
    if not with_entropy:
        return out_lp.reshape(rows, length), None
    out_ent = hidden.new_zeros(rows * length, dtype=torch.float32)
    if parts_ent:
        out_ent = out_ent.index_put((where,), torch.cat(parts_ent))
    return out_lp.reshape(rows, length), out_ent.reshape(rows, length)


def response_log_probs(
    model: Any,
    batch: TransitionBatch,
    *,
    temperature: float,
    chunk_tokens: int,
    entropy: bool = False,
    share_prompts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([B, R] log-probs of `batch`'s response tokens, [B, R] their entropy when asked, else None)
    under `model`, 0 where the response mask is 0: on chunks of `chunk_tokens` tokens (see the module
    docstring) when `chunk_tokens` > 0 and the model allows it, else from the plain logits. On the
    chunked path, with `share_prompts`, a prompt several rows share runs once (`shared_prompt`)."""
    mask = batch.response_mask
    if chunk_tokens > 0 and chunked_head_supported(model):
        decoder = model.get_decoder()
        shares = share_prompts and shared_prompt.shareable(model)
        hidden = shared_prompt.response_hidden(decoder, batch) if shares else None
        if hidden is None:
            r = batch.response_length
            hidden = decoder(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state[:, -(r + 1) : -1]
        return head_log_probs(
            hidden,
            model.get_output_embeddings(),
            batch.responses,
            mask,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=entropy,
        )
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.response_length + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1]
    m = mask.float()
    if entropy:
        lp, ent = losses.log_probs_and_entropy(logits, batch.responses, temperature)
        return lp * m, ent * m
    return losses.token_log_probs(logits, batch.responses, temperature) * m, None
