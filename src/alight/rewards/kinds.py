"""The reward kinds by name (`REWARDS`, `reward.kind`) and what the rest of alight asks about each.

Where a rollout's reward comes from: `agent` (what the agent returns, emits or posts), `tests` (the
tests of a command agent's working copy, alight.rewards.tests) or `judge` (an LLM judge wrapping the
agent, alight.rewards.judge). Callers ask a kind's capabilities (`reward_kind(reward).runs_in_sandbox`),
never its name; a new kind is a `RewardKind` subclass plus one `REWARDS.register` call.
"""

from __future__ import annotations

from typing import ClassVar

from alight.config.schema import RewardConfig
from alight.parts import Registry


class RewardKind:
    """One `reward.kind`: its checks and what others ask about it, as class attributes."""

    kind: ClassVar[str]
    #: The agent's own reward counts: what it returns, emits, or (a command agent's program) posts.
    agent_gives_reward: ClassVar[bool] = False
    #: Given in a command agent's sandbox after its program ran (needs `agent.command`; the sandbox
    #: is used even when it neither isolates nor names a working copy).
    runs_in_sandbox: ClassVar[bool] = False
    #: Given by a wrapper around the agent (alight.rewards.judge.JudgedAgent), whatever the agent is.
    wraps_agent: ClassVar[bool] = False

    @classmethod
    def check_config(cls, reward: RewardConfig) -> None:
        """ConfigError, in one line, for a `reward` section this kind cannot run with (checks that
        need the agent's command are the command agent's: alight.rewards.tests.check_tests_reward)."""
        return None


class AgentReward(RewardKind):
    kind = "agent"
    agent_gives_reward = True


class TestsReward(RewardKind):
    kind = "tests"
    runs_in_sandbox = True


class JudgeReward(RewardKind):
    kind = "judge"
    wraps_agent = True

    @classmethod
    def check_config(cls, reward: RewardConfig) -> None:
        from alight.rewards.judge_score import check_judge

        check_judge(reward.judge)


#: The reward kinds (`reward.kind`), the default first.
REWARDS: Registry[RewardKind] = Registry(
    "reward.kind", {"agent": AgentReward, "tests": TestsReward, "judge": JudgeReward}
)


def reward_kind(reward: RewardConfig | None) -> type[RewardKind]:
    """The kind of the `reward` section (None: the default, the agent's own reward); ConfigError
    naming the kinds for an unknown one."""
    return REWARDS.get((reward if reward is not None else RewardConfig()).kind)
