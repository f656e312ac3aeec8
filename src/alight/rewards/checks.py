"""Checks of the `reward` group, run once where a config is validated (one-line ConfigErrors)."""

from __future__ import annotations

from alight.config.schema import RewardConfig
from alight.errors import ConfigError

#: Where a rollout's reward comes from: the agent itself, the tests of its working copy, an LLM judge.
REWARD_KINDS = ("agent", "tests", "judge")


def check_reward(reward: RewardConfig) -> None:
    """ConfigError, in one line, for a `reward` group no run can use."""
    if reward.kind not in REWARD_KINDS:
        raise ConfigError(f"reward.kind must be one of {', '.join(REWARD_KINDS)}, got {reward.kind!r}")
    if reward.kind == "judge":
        from alight.rewards.judge_score import check_judge

        check_judge(reward.judge)
