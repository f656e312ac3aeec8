"""Policy-gradient losses as pure functions over tensors: clipped PPO/GRPO objective, KL to a
reference, entropy, supervised NLL, and how token values aggregate into one loss.

Shapes: B rows (transitions), R response tokens; `mask` is 1 on tokens the loss sees. Every
function returns tensors and touches no model, so the tests drive them with small tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl")


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, R] log p(target) under log_softmax(logits / temperature), logits [B, R, V]."""
    import torch

    scaled = logits.float() / temperature if temperature not in (0.0, 1.0) else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, R] entropy of softmax(logits / temperature) at each position."""
    import torch

    scaled = logits.float() / temperature if temperature not in (0.0, 1.0) else logits.float()
    log_p = torch.log_softmax(scaled, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def log_probs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_log_probs` and `entropy` of the same logits from one log-softmax (half the memory)."""
    import torch

    scaled = logits.float() / temperature if temperature not in (0.0, 1.0) else logits.float()
    log_p = torch.log_softmax(scaled, dim=-1)
    return log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", *, normaliser: float | None = None
) -> torch.Tensor:
    """One scalar from [B, R] token values.

    token_mean: sum over every masked token / their count; seq_mean_token_mean: each row's token
    mean, averaged over rows; seq_mean_token_sum: each row's token sum, averaged over rows.
    `normaliser` replaces the count (tokens or rows) so micro-batches of one optimizer step add up
    to the mean over the whole step.
    """
    m = mask.to(values.dtype)
    if mode == "token_mean":
        total = (values * m).sum()
        return total / (normaliser if normaliser is not None else m.sum().clamp(min=1.0))
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        per_row = (values * m).sum(-1)
        if mode == "seq_mean_token_mean":
            per_row = per_row / m.sum(-1).clamp(min=1.0)
        rows = float(values.shape[0]) if normaliser is None else normaliser
        return per_row.sum() / rows
    raise ValueError(f"loss aggregation must be one of {', '.join(LOSS_AGGREGATIONS)}, got {mode!r}")


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO/GRPO loss max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(log p - old log p).

    Returns (loss [B, R], clipped [B, R] as 0/1 floats: where the clipped term was taken,
    approx_kl [B, R]: old log p - log p, the k1 estimate of KL(old || new)).
    """
    import torch

    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float(), -log_ratio


def decoupled_policy_loss(
    log_probs: torch.Tensor,
    proximal_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    is_cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled PPO for off-policy rows: the clipped loss of `clipped_policy_loss` with the ratio
    taken to the proximal policy (the weights before this update), each token weighted by the
    truncated importance weight w = min(p_prox / p_behav, is_cap) (no gradient through w; 0: no
    cap). Where proximal = behaviour (fresh rows) w = 1 and this is `clipped_policy_loss`.

    Returns (loss [B, R], clipped [B, R], approx_kl [B, R] to the proximal policy, weight [B, R],
    capped [B, R] as 0/1 floats: where the cap applied)."""
    loss, clipped, approx_kl = clipped_policy_loss(log_probs, proximal_log_probs, advantages, clip_low, clip_high)
    raw = (proximal_log_probs - behaviour_log_probs).clamp(-20.0, 20.0).exp().detach()
    weight = raw.clamp(max=is_cap) if is_cap > 0 else raw
    capped = (raw > is_cap).float() if is_cap > 0 else raw.new_zeros(raw.shape)
    return loss * weight, clipped, approx_kl, weight, capped


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "low_var_kl") -> torch.Tensor:
    """[B, R] per-token estimate of KL(policy || reference) from sampled tokens' log-probs.

    kl: log p - log q (k1); abs: |k1|; mse: (k1)^2 / 2 (k2); low_var_kl: exp(q - p) - (q - p) - 1
    (k3, unbiased and non-negative; clamped to 10 as verl does for stability)."""
    diff = log_probs - ref_log_probs
    if estimator == "kl":
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator == "mse":
        return 0.5 * diff.square()
    if estimator == "low_var_kl":
        reverse = (-diff).clamp(-20.0, 20.0)
        return (reverse.exp() - reverse - 1.0).clamp(max=10.0)
    raise ValueError(f"KL estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")


def nll_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", *, normaliser: float | None = None
) -> torch.Tensor:
    """Supervised loss: the aggregated negative log-likelihood of the masked tokens."""
    return aggregate(-log_probs, mask, mode, normaliser=normaliser)


def log_prob_gap(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """|trainer - engine| log-prob over the masked tokens: (sum, max, tokens). The engine's recorded
    log-probs and the trainer's forward on the same weights should agree; a growing gap breaks the
    off-policy correction that takes the engine's as the behaviour policy."""
    gap = (trainer.detach().float() - engine.float()).abs() * mask
    tokens = float(mask.sum())
    return float(gap.sum()), float(gap.max()) if tokens else 0.0, tokens
