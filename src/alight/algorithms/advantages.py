"""Advantage estimators over groups: GRPO, RLOO and REINFORCE++-baseline, vectorised with numpy.

Each takes one reward per item and the group id of each item (the rollouts sampled for one task
share a group) and returns one advantage per item. An item is a rollout (credit modes `identity`
and `last`: the rollout's return) or a transition (per-transition credit modes: the group's
statistics are then pooled over the transitions of all its rollouts). No estimator returns NaN:
a group of one item, or of equal rewards, gets advantage 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt

from alight.errors import ConfigError

#: Estimator names a config may give.
ESTIMATORS = ("grpo", "rloo", "reinforce_pp")

FloatArray = npt.NDArray[np.float64]


def group_index(group_ids: Sequence[Hashable]) -> tuple[npt.NDArray[np.int64], int]:
    """(dense group number of each item, number of groups), numbered in order of first appearance."""
    numbers: dict[Hashable, int] = {}
    index = np.fromiter((numbers.setdefault(g, len(numbers)) for g in group_ids), dtype=np.int64, count=len(group_ids))
    return index, len(numbers)


def _centred(rewards: FloatArray, index: npt.NDArray[np.int64], n: int) -> tuple[FloatArray, FloatArray]:
    """(reward minus its group's mean, unbiased std of its group) per item.

    Groups of equal rewards (and of one item) get exactly 0 and std 0, free of rounding noise.
    """
    counts = np.bincount(index, minlength=n).astype(np.float64)
    means = np.bincount(index, weights=rewards, minlength=n) / np.maximum(counts, 1.0)
    centred = rewards - means[index]
    # A second pass takes out what rounding the mean left ([100, 100 - 1e-14] has the mean 100.0): the
    # centred values then sum to 0 within rounding of themselves, not of the rewards.
    centred -= (np.bincount(index, weights=centred, minlength=n) / np.maximum(counts, 1.0))[index]
    low, high = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(low, index, rewards)
    np.maximum.at(high, index, rewards)
    centred[(low == high)[index]] = 0.0
    squares = np.bincount(index, weights=centred * centred, minlength=n)
    stds = np.sqrt(np.where(counts > 1, squares / np.maximum(counts - 1.0, 1.0), 0.0))
    return centred, stds[index]


def grpo_advantages(
    rewards: Sequence[float] | FloatArray, group_ids: Sequence[Hashable], *, norm_std: bool = True, eps: float = 1e-6
) -> FloatArray:
    """GRPO (Shao et al. 2024, DeepSeekMath): `A_i = (r_i - mean_g) / (std_g + eps)`.

    std is the unbiased group std, as TRL and verl compute it (`torch.std`). `norm_std=False`
    gives `A_i = r_i - mean_g` (Dr. GRPO, Liu et al. 2025). Within each group the advantages sum
    to zero (up to rounding). A group of one item gets 0.
    """
    r = np.asarray(rewards, dtype=np.float64)
    index, n = group_index(group_ids)
    centred, stds = _centred(r, index, n)
    return centred / (stds + eps) if norm_std else centred


def rloo_advantages(
    rewards: Sequence[float] | FloatArray,
    group_ids: Sequence[Hashable],
    *,
    units: Sequence[Hashable] | None = None,
) -> FloatArray:
    """RLOO (Ahmadian et al. 2024): `A_i = r_i - mean of the other items of the group`.

    With `units` (the rollout id of each item, when items are transitions) the baseline leaves out
    every item of the same unit: a transition is compared with the other rollouts' transitions.
    An item with nothing left to compare with gets 0.
    """
    r = np.asarray(rewards, dtype=np.float64)
    index, n = group_index(group_ids)
    group_sum = np.bincount(index, weights=r, minlength=n)
    group_count = np.bincount(index, minlength=n).astype(np.float64)
    if units is None:
        own_sum, own_count = r, np.ones(r.shape, dtype=np.float64)
    else:
        # A unit lives in one group; number the (group, unit) pairs so equal unit ids in two groups stay apart.
        unit_index, m = group_index(list(zip(index.tolist(), units, strict=True)))
        own_sum = np.bincount(unit_index, weights=r, minlength=m).astype(np.float64)[unit_index]
        own_count = np.bincount(unit_index, minlength=m).astype(np.float64)[unit_index]
    others = group_count[index] - own_count
    baseline = (group_sum[index] - own_sum) / np.maximum(others, 1.0)
    out: FloatArray = np.where(others > 0, r - baseline, 0.0)
    return out


def reinforce_pp_advantages(
    rewards: Sequence[float] | FloatArray, group_ids: Sequence[Hashable], *, norm_std: bool = True, eps: float = 1e-6
) -> FloatArray:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262; verl's `reinforce_plus_plus_baseline`).

    Subtract the group mean, then whiten over the whole batch: `(a - mean(a)) / (std(a) + eps)`
    with the unbiased batch std (`norm_std=False` skips the whitening). verl whitens over tokens;
    here over items, so each rollout (or transition) counts once, as in GRPO.
    """
    r = np.asarray(rewards, dtype=np.float64)
    index, n = group_index(group_ids)
    centred, _ = _centred(r, index, n)
    if not norm_std or centred.size < 2:
        return centred
    whitened: FloatArray = (centred - centred.mean()) / (centred.std(ddof=1) + eps)
    return whitened


def compute_advantages(
    estimator: str,
    rewards: Sequence[float] | FloatArray,
    group_ids: Sequence[Hashable],
    *,
    units: Sequence[Hashable] | None = None,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> FloatArray:
    """Advantages by estimator name; `units` matters only to RLOO. ConfigError for an unknown name."""
    if estimator == "grpo":
        return grpo_advantages(rewards, group_ids, norm_std=norm_std, eps=eps)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_ids, units=units)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards, group_ids, norm_std=norm_std, eps=eps)
    raise ConfigError(f"algorithm advantage must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
