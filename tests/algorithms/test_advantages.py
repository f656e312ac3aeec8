"""Advantage estimators on hand-computed tables, and their properties (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from alight.algorithms import compute_advantages, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from alight.errors import ConfigError

S3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1, 0]

# (estimator, rewards, groups, options, expected)
TABLE = [
    ("grpo", [1, 0, 1, 0], ["g"] * 4, {}, [0.5 / S3, -0.5 / S3, 0.5 / S3, -0.5 / S3]),
    ("grpo", [1, 0, 2, 2], ["a", "a", "b", "b"], {}, [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0]),
    ("grpo", [1, 0, 1, 0], ["g"] * 4, {"norm_std": False}, [0.5, -0.5, 0.5, -0.5]),
    ("grpo", [3.0], ["alone"], {}, [0.0]),  # a group of one: no baseline, advantage 0
    ("grpo", [2.0, 2.0, 2.0], ["g"] * 3, {}, [0.0, 0.0, 0.0]),  # zero std: 0, never NaN
    ("rloo", [1, 0, 1, 0], ["g"] * 4, {}, [2 / 3, -2 / 3, 2 / 3, -2 / 3]),
    ("rloo", [1, 0, 5], ["a", "a", "b"], {}, [1.0, -1.0, 0.0]),
    # items are transitions of rollouts x, x, y: the baseline leaves out the item's own rollout
    ("rloo", [1, 1, 0], ["g"] * 3, {"units": ["x", "x", "y"]}, [1.0, 1.0, -1.0]),
    # group-centred [.5, -.5, -1, 1], whitened by the batch std sqrt(2.5 / 3)
    ("reinforce_pp", [1, 0, 2, 4], ["a", "a", "b", "b"], {}, [v / math.sqrt(2.5 / 3) for v in (0.5, -0.5, -1, 1)]),
    ("reinforce_pp", [1, 0, 2, 4], ["a", "a", "b", "b"], {"norm_std": False}, [0.5, -0.5, -1.0, 1.0]),
    ("reinforce_pp", [7.0], ["a"], {}, [0.0]),
]


@pytest.mark.parametrize(("estimator", "rewards", "groups", "options", "expected"), TABLE)
def test_estimators(
    estimator: str, rewards: list[float], groups: list[str], options: dict, expected: list[float]
) -> None:  # type: ignore[type-arg]
    got = compute_advantages(estimator, rewards, groups, **options)
    assert got.tolist() == pytest.approx(expected, abs=1e-5)


def test_unknown_estimator_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="grpo, rloo, reinforce_pp"):
        compute_advantages("ppo2", [1.0], ["g"])


groups_and_rewards = st.lists(
    st.tuples(st.integers(0, 5), st.floats(-100, 100, allow_nan=False)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(items=groups_and_rewards, norm_std=st.booleans())
@example(items=[(0, 100.0), (0, 99.99999999999999)], norm_std=True)  # the mean rounds to 100.0 (CI, 2026-11-28)
def test_grpo_advantages_sum_to_zero_within_each_group(items: list[tuple[int, float]], norm_std: bool) -> None:
    groups = [g for g, _ in items]
    rewards = [r for _, r in items]
    advantages = grpo_advantages(rewards, groups, norm_std=norm_std)
    assert np.isfinite(advantages).all()
    for group in set(groups):
        members = [a for a, g in zip(advantages, groups, strict=True) if g == group]
        scale = max(1.0, max(abs(a) for a in members))
        assert abs(math.fsum(members)) <= 1e-9 * len(members) * scale
        if len(members) == 1:
            assert members[0] == 0.0


@settings(max_examples=200, deadline=None)
@given(items=groups_and_rewards)
def test_rloo_and_reinforce_pp_are_finite_and_centred(items: list[tuple[int, float]]) -> None:
    groups = [g for g, _ in items]
    rewards = [r for _, r in items]
    rloo = rloo_advantages(rewards, groups)
    rpp = reinforce_pp_advantages(rewards, groups)
    assert np.isfinite(rloo).all() and np.isfinite(rpp).all()
    for group in set(groups):  # RLOO is n/(n-1) times the centred reward: it sums to zero too
        members = [a for a, g in zip(rloo, groups, strict=True) if g == group]
        assert abs(math.fsum(members)) <= 1e-9 * len(members) * max(1.0, max(abs(a) for a in members))
