"""Stale rows (async training) on verl: decoupled PPO with truncated importance sampling.

A row the loop marks stale (`TransitionBatch.stale`) was served by weights older than the ones
being updated. alight's loss for it is `losses.decoupled_policy_loss`; verl 0.9.1 expresses the
same thing as its rollout correction in *decoupled* mode (three policies), which `update` drives:

| alight | verl |
|---|---|
| behaviour log-probs (the engine's: the batch's `old_log_probs`) | `rollout_log_probs` |
| proximal log-probs (the actor's before the update; fresh rows: | `old_log_probs` (the PPO ratio's anchor) |
| the behaviour ones) | |
| w = min(p_prox / p_behav, `algorithm.is_cap`) per token, no gradient | `rollout_is_weights`, by |
| | `compute_rollout_correction_and_rejection_mask` with `algorithm.rollout_correction` |
| | `{rollout_is: token, rollout_is_threshold: is_cap}` (`is_cap: 0`, no cap: inf) |
| the clipped loss times w | the vanilla policy loss times `rollout_is_weights` |
| `actor/is_weight_mean` | `rollout_corr/rollout_is_mean` |
| `actor/is_capped_frac` | `rollout_corr/rollout_is_ratio_fraction_high` |

`trainer.mode: async` sets `algorithm.rollout_correction` (`settings`); sync leaves verl's default
(no correction) so the config is today's. A batch without stale rows sends none of these tensors,
so its loss is today's too. The `verl:` block may refine the correction (sequence-level weights,
IcePop bounds, rejection sampling); verl's bypass mode (no proximal policy) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alight.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from verl import DataProto

    from alight.algorithms.batch import TransitionBatch
    from alight.config.schema import AlgorithmConfig

#: alight's metric names -> verl's rollout-correction metrics.
IS_METRICS = {
    "actor/is_weight_mean": "rollout_corr/rollout_is_mean",
    "actor/is_capped_frac": "rollout_corr/rollout_is_ratio_fraction_high",
}
#: What an update without stale rows reports (every weight is 1), as the embedded backend does.
ON_POLICY_METRICS = {"actor/is_weight_mean": 1.0, "actor/is_capped_frac": 0.0}


def settings(algo: AlgorithmConfig) -> dict[str, Any]:
    """verl's `algorithm.rollout_correction` for alight's decoupled loss (token-level TIS at is_cap)."""
    return {
        "rollout_is": "token",
        "rollout_is_threshold": float(algo.is_cap) if algo.is_cap > 0 else math.inf,
        "rollout_is_batch_normalize": False,
        "rollout_rs": None,
        "bypass_mode": False,
    }


def check(verl_config: Any) -> None:
    """A correction alight cannot drive: one `ConfigError` line."""
    if verl_config.algorithm.rollout_correction.get("bypass_mode", False):
        raise ConfigError(
            "verl.algorithm.rollout_correction.bypass_mode is not supported: alight's stale rows train "
            "against the proximal policy the actor computes (decoupled mode)"
        )


def proximal_log_probs(batch: TransitionBatch, log_probs: Callable[[TransitionBatch], torch.Tensor]) -> None:
    """Set `batch.proximal_log_probs`: the stale rows' `log_probs` (the actor's, before any update),
    the behaviour ones elsewhere. No stale row: nothing (the batch stays on-policy)."""
    if batch.stale is None or not bool(batch.stale.any()):
        return
    proximal = batch.old_log_probs.clone()
    stale = batch.stale.nonzero().flatten().tolist()
    part = batch.select(stale)
    proximal[stale, : part.response_length] = log_probs(part) * part.response_mask
    batch.proximal_log_probs = proximal


def apply(data: DataProto, proximal: torch.Tensor, verl_config: Any) -> dict[str, float]:
    """Turn `data` (its `old_log_probs` the behaviour policy) into verl's decoupled batch: behaviour
    to `rollout_log_probs`, `proximal` to `old_log_probs`, verl's `rollout_is_weights` (and its
    rejection mask, where configured) added. Returns the IS metrics in alight's names."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    corr = verl_config.algorithm.rollout_correction
    behaviour = data.batch["old_log_probs"]
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=proximal,
        rollout_log_prob=behaviour,
        response_mask=data.batch["response_mask"],
        rollout_is=corr.get("rollout_is"),
        rollout_is_threshold=corr.get("rollout_is_threshold"),
        rollout_is_batch_normalize=bool(corr.get("rollout_is_batch_normalize", False)),
        rollout_rs=corr.get("rollout_rs"),
        rollout_rs_threshold=corr.get("rollout_rs_threshold"),
    )
    data.batch["rollout_log_probs"] = behaviour
    data.batch["old_log_probs"] = proximal.to(behaviour.dtype)
    data.batch["response_mask"] = mask.to(data.batch["response_mask"].dtype)
    if weights is not None:
        data.batch["rollout_is_weights"] = weights.batch["rollout_is_weights"]
    return {ours: float(metrics.get(theirs, ON_POLICY_METRICS[ours])) for ours, theirs in IS_METRICS.items()}
