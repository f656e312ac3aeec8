"""The arithmetic of the embedded backend's RL update, apart from its model and optimizer.

One micro-batch's loss (the clipped policy loss, or the decoupled one against proximal log-probs
for stale rows, plus the entropy bonus and the KL penalty) with the token sums its metrics average,
the engine-trainer log-prob gap, the forward passes that fill log-probs without gradient, and the
metrics of a whole update. `alight.backends.embedded` runs them around its forward and backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from alight.backends import losses

if TYPE_CHECKING:
    import torch

    from alight.algorithms.batch import TransitionBatch
    from alight.config.schema import AlgorithmConfig

#: A forward pass under the policy: (log-probs, entropy or None) of a batch's response tokens.
LogProbs = Callable[["TransitionBatch"], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(slots=True)
class StepSums:
    """Sums over one optimizer step's micro-batches; `metrics` averages them over the loss tokens."""

    loss: float = 0.0
    clipfrac: float = 0.0
    ppo_kl: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    is_w: float = 0.0
    is_cap: float = 0.0
    tokens: float = 0.0  # the loss tokens of the micro-batches that ran

    def metrics(self) -> dict[str, float]:
        per_token = max(self.tokens, 1.0)  # the metrics average the tokens that ran
        return {
            "actor/loss": self.loss,
            "actor/pg_clipfrac": self.clipfrac / per_token,
            "actor/ppo_kl": self.ppo_kl / per_token,
            "actor/kl": self.kl / per_token,
            "actor/entropy": self.entropy / per_token,
            "actor/is_weight_mean": self.is_w / per_token,
            "actor/is_capped_frac": self.is_cap / per_token,
        }


def micro_batch_loss(
    micro: TransitionBatch,
    log_probs: torch.Tensor,
    token_entropy: torch.Tensor,
    cfg: AlgorithmConfig,
    *,
    normaliser: float,
    reference_log_probs: Callable[[TransitionBatch], torch.Tensor],
    sums: StepSums,
) -> torch.Tensor:
    """The RL loss of `micro` (on the policy's device) from its log-probs and entropy under the
    policy; adds its token sums to `sums` (all but the loss, which the caller adds after backward).
    `reference_log_probs` runs only with a KL penalty."""
    import torch

    mask = micro.response_mask
    sums.tokens += float(mask.sum())
    if cfg.entropy_coef == 0:
        token_entropy = token_entropy.detach()
    proximal = micro.proximal_log_probs
    if proximal is None and micro.stale is not None and bool(micro.stale.any()):  # one step: see `update`
        proximal = torch.where(micro.stale[:, None], log_probs.detach() * mask, micro.old_log_probs)
    if proximal is None:  # on-policy rows: the behaviour policy is the proximal one
        pg, clipped, approx_kl = losses.clipped_policy_loss(
            log_probs, micro.old_log_probs, micro.advantages, cfg.clip_ratio_low, cfg.clip_ratio_high
        )
        weight, capped = mask.to(torch.float32), torch.zeros_like(log_probs)
    else:
        pg, clipped, approx_kl, weight, capped = losses.decoupled_policy_loss(
            log_probs,
            proximal,
            micro.old_log_probs,
            micro.advantages,
            cfg.clip_ratio_low,
            cfg.clip_ratio_high,
            cfg.is_cap,
        )
    loss = losses.aggregate(pg, mask, cfg.loss_agg, normaliser=normaliser)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * losses.aggregate(token_entropy, mask, cfg.loss_agg, normaliser=normaliser)
    if cfg.kl_coef:
        kl = losses.kl_penalty(log_probs, reference_log_probs(micro), cfg.kl_estimator)
        loss = loss + cfg.kl_coef * losses.aggregate(kl, mask, cfg.loss_agg, normaliser=normaliser)
        sums.kl += float((kl.detach() * mask).sum())
    m = mask.to(torch.float32)
    sums.clipfrac += float((clipped * m).sum())
    sums.ppo_kl += float((approx_kl.detach() * m).sum())
    sums.entropy += float((token_entropy.detach() * m).sum())
    sums.is_w += float((weight * m).sum())
    sums.is_cap += float((capped * m).sum())
    return loss


def add_log_prob_gap(
    gap: list[float], log_probs: torch.Tensor, micro: TransitionBatch, recorded: list[bool]
) -> list[float]:
    """`gap` (sum, max, tokens of the engine-trainer log-prob gap) with `micro`'s rows whose log-probs
    the engine `recorded` added."""
    import torch

    mask = micro.response_mask
    rows = torch.tensor(recorded, dtype=torch.bool, device=mask.device)
    gap_sum, gap_max, gap_tokens = losses.log_prob_gap(log_probs, micro.old_log_probs, mask * rows[:, None])
    return [gap[0] + gap_sum, max(gap[1], gap_max), gap[2] + gap_tokens]


def fill_log_probs(
    target: torch.Tensor, batch: TransitionBatch, rows: list[int], micro: int, log_probs: LogProbs
) -> None:
    """Writes the log-probs of `batch`'s `rows` (0 past each response) into those rows of `target`,
    `micro` rows per forward pass, without gradient."""
    import torch

    with torch.no_grad():
        for start in range(0, len(rows), micro):
            part_rows = rows[start : start + micro]
            part = batch.select(part_rows)
            target[part_rows, : part.response_length] = log_probs(part)[0].cpu() * part.response_mask


def skipped_update_metrics(rows: int, mini: int, micro: int, epochs: int, lr: float) -> dict[str, float]:
    """The metrics of an update with nothing to learn: every step and micro-batch it would have run, skipped."""
    steps = epochs * math.ceil(rows / mini)
    micros = epochs * sum(math.ceil(min(mini, rows - s) / micro) for s in range(0, rows, mini))
    return {
        "actor/optimizer_steps": 0.0,
        "actor/skipped_steps": float(steps),
        "actor/skipped_micro_batches": float(micros),
        "actor/update_tokens": 0.0,
        "actor/lr": lr,
    }
