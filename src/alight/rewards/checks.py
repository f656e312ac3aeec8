"""Checks of the `reward` group, run once where a config is validated (one-line ConfigErrors)."""

from __future__ import annotations

from alight.config.schema import RewardConfig
from alight.rewards.kinds import reward_kind


def check_reward(reward: RewardConfig) -> None:
    """ConfigError, in one line, for a `reward` group no run can use: an unknown kind (naming the
    kinds), or settings its kind refuses."""
    reward_kind(reward).check_config(reward)
