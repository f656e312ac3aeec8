"""The statistics `alight eval` reports, as pure functions over per-task rewards: the mean reward
with a bootstrap confidence interval over tasks, pass@k with the unbiased estimator, and the paired
bootstrap of the difference between two models evaluated on the same tasks.

Every bootstrap here draws its resamples the same way (`resample_indices`: numpy's
`default_rng(seed).integers(0, tasks, (resamples, tasks))`), so one seed gives every model and every
comparison the same resampled task sets, and a test can redraw them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Difference:
    """A model's mean reward minus the baseline's, with its paired bootstrap interval and the share
    of resamples where the difference is 0 or less (a one-sided bootstrap p-value for "better")."""

    value: float
    low: float
    high: float
    share_not_better: float


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task (Chen et al. 2021): the chance that k of its n samples, drawn
    without replacement, hold at least one of its c successes: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(successes: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over tasks, each with `successes[i]` successes among its n samples."""
    if not successes:
        raise ValueError("pass@k needs at least one task")
    return sum(pass_at_k(n, c, k) for c in successes) / len(successes)


def resample_indices(tasks: int, *, resamples: int, seed: int) -> npt.NDArray[np.int64]:
    """`resamples` rows of `tasks` task indices drawn with replacement: the bootstrap's task sets."""
    if tasks < 1 or resamples < 1:
        raise ValueError(f"a bootstrap needs tasks and resamples, not {tasks} tasks x {resamples} resamples")
    return np.random.default_rng(seed).integers(0, tasks, size=(resamples, tasks))


def percentile_bounds(values: npt.NDArray[np.float64], confidence: float) -> tuple[float, float]:
    """The percentile interval of bootstrap statistics: the (1-confidence)/2 and (1+confidence)/2
    quantiles as order statistics (the smallest value whose empirical CDF reaches the level, numpy's
    "inverted_cdf")."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    ordered = np.sort(values)
    count = len(ordered)

    def at(level: float) -> float:
        rank = max(1, math.ceil(level * count - 1e-9))  # 1-based: the first value whose CDF reaches `level`
        return float(ordered[rank - 1])

    alpha = (1.0 - confidence) / 2.0
    return at(alpha), at(1.0 - alpha)


def bootstrap_mean(
    rewards: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """The mean of per-task rewards with its percentile bootstrap interval, resampling tasks."""
    values = np.asarray(rewards, dtype=np.float64)
    index = resample_indices(len(values), resamples=resamples, seed=seed)
    low, high = percentile_bounds(values[index].mean(axis=1), confidence)
    return Interval(float(values.mean()), low, high)


def paired_bootstrap(
    baseline: Sequence[float],
    other: Sequence[float],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Difference:
    """mean(other) - mean(baseline) over the same tasks (position i is task i for both), with the
    paired bootstrap: each resample draws one task set and takes both models' rewards on it."""
    base = np.asarray(baseline, dtype=np.float64)
    new = np.asarray(other, dtype=np.float64)
    if base.shape != new.shape:
        raise ValueError(f"a paired bootstrap needs the same tasks for both models, not {len(base)} and {len(new)}")
    index = resample_indices(len(base), resamples=resamples, seed=seed)
    differences = new[index].mean(axis=1) - base[index].mean(axis=1)
    low, high = percentile_bounds(differences, confidence)
    return Difference(float(new.mean() - base.mean()), low, high, float(np.mean(differences <= 0.0)))
