"""The statistics of `alight eval` against independent computations: pass@k by enumerating every
k-subset of a task's samples, bootstrap intervals redrawn with numpy and cut with numpy's own
quantile, and paired differences whose answer is known without resampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from alight.algorithms.evaluation import (
    bootstrap_mean,
    mean_pass_at_k,
    paired_bootstrap,
    pass_at_k,
    percentile_bounds,
)


def enumerated_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of k-subsets of the samples that hold a success: what pass@k estimates."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (4, 2, 1, 0.5),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2); the biased 1 - (1 - c/n)^k gives 0.75
        (4, 2, 3, 1.0),  # any 3 of 4 samples hold one of the 2 successes
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (10, 3, 4, 1 - 35 / 210),
    ],
)
def test_pass_at_k_table(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_every_k_subset() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(enumerated_pass_at_k(outcomes, k)), (n, c, k)
    assert mean_pass_at_k([0, 2, 4], 4, 2) == pytest.approx((0 + 5 / 6 + 1) / 3)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 5), (4, 1, 0), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def redrawn_means(rewards: list[float], resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means drawn as the module documents, one resample at a time."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(rewards), size=(resamples, len(rewards)))
    return np.array([sum(rewards[i] for i in row) / len(row) for row in draws])


@pytest.mark.parametrize(("resamples", "seed"), [(2000, 0), (1000, 7), (999, 3), (40, 1)])
def test_bootstrap_interval_is_numpys_percentile_of_the_redrawn_means(resamples: int, seed: int) -> None:
    rewards = list(np.random.default_rng(123).random(17))  # continuous: no ties hide an index off by one
    got = bootstrap_mean(rewards, resamples=resamples, seed=seed)
    means = redrawn_means(rewards, resamples, seed)
    low, high = np.quantile(means, [0.025, 0.975], method="inverted_cdf")
    assert got.value == pytest.approx(float(np.mean(rewards)))
    assert got.low == pytest.approx(low, abs=1e-12) and got.high == pytest.approx(high, abs=1e-12)
    assert got.low < got.value < got.high


def test_percentile_bounds_by_hand() -> None:
    values = np.arange(1.0, 41.0)[::-1].copy()  # 40 values, unsorted: 40, 39, ..., 1
    assert percentile_bounds(values, 0.95) == (1.0, 39.0)  # ceil(0.025*40)=1st, ceil(0.975*40)=39th
    assert percentile_bounds(values, 0.5) == (10.0, 30.0)  # 25% of 40 -> 10th, 75% -> 30th
    with pytest.raises(ValueError, match="confidence"):
        percentile_bounds(values, 1.0)


def test_constant_rewards_have_a_zero_width_interval() -> None:
    got = bootstrap_mean([0.5] * 6, resamples=200)
    assert (got.value, got.low, got.high) == (0.5, 0.5, 0.5)


def test_paired_bootstrap_of_a_constant_gain_is_that_gain() -> None:
    """Task difficulty varies a lot, the second model gains 0.1 on every task: paired, every resample
    shows exactly +0.1; resampling the two models independently would mix the tasks' spread in."""
    baseline = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6]
    better = [r + 0.1 for r in baseline]
    got = paired_bootstrap(baseline, better, resamples=500, seed=4)
    assert got.value == pytest.approx(0.1)
    assert got.low == pytest.approx(0.1) and got.high == pytest.approx(0.1)
    assert got.share_not_better == 0.0
    worse = paired_bootstrap(better, baseline, resamples=500, seed=4)
    assert worse.value == pytest.approx(-0.1) and worse.share_not_better == 1.0


def test_paired_bootstrap_matches_a_redraw() -> None:
    rng = np.random.default_rng(5)
    baseline, other = list(rng.random(11)), list(rng.random(11))
    got = paired_bootstrap(baseline, other, resamples=300, seed=9)
    draws = np.random.default_rng(9).integers(0, 11, size=(300, 11))
    diffs = np.array([np.mean([other[i] - baseline[i] for i in row]) for row in draws])
    assert got.low == pytest.approx(np.quantile(diffs, 0.025, method="inverted_cdf"))
    assert got.high == pytest.approx(np.quantile(diffs, 0.975, method="inverted_cdf"))
    assert got.share_not_better == pytest.approx(np.mean(diffs <= 0))
    with pytest.raises(ValueError, match="same tasks"):
        paired_bootstrap([1.0], [1.0, 0.0])
