"""What runners run for a config's `agent` section: its entrypoint or a command agent, checked on
this machine (`runner_agent`); wrapped so an LLM judge gives its reward (`judged_agent`); and the
`alight runner` options that run it on another machine (`runner_command`). Shared by the training
stack, the commands and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from alight.config.schema import AgentConfig, RewardConfig
from alight.errors import ConfigError

if TYPE_CHECKING:
    from alight.agent import LitAgent


def runner_agent(agent: AgentConfig, *, check: bool = True, reward: RewardConfig | None = None) -> str | LitAgent:
    """What runners run for a config's `agent` section: its entrypoint (each runner imports it), or
    a `CommandAgent` for `agent.command` (sent to runners as it is, with its sandbox and `reward`).
    With `check`, an entrypoint that does not import, a command whose executable is missing, or a
    sandbox or tests reward this machine cannot run raises a one-line ConfigError."""
    from alight.config.loading import AGENT_CHOICE

    if (agent.entrypoint is None) == (agent.command is None):
        raise ConfigError(AGENT_CHOICE)
    if check:
        from alight.command_agent import check_command_agent
        from alight.rewards.checks import check_reward

        reward = reward if reward is not None else RewardConfig()
        check_reward(reward)
        check_command_agent(agent.command, agent.sandbox, reward)
    if agent.command is not None:
        from alight.command_agent import command_agent

        return command_agent(agent.command, agent.name, sandbox=agent.sandbox, reward=reward)
    assert agent.entrypoint is not None
    if check:
        from alight.agent import load_agent

        load_agent(agent.entrypoint)
    if agent.name is not None:  # the agent's spans carry this name, not the function's or class's
        from alight.agent import NamedEntrypoint

        return NamedEntrypoint(agent.entrypoint, agent.name)
    return agent.entrypoint


def judged_agent(agent: str | LitAgent, reward: RewardConfig, run_dir: Path | None) -> str | LitAgent:
    """`agent` (as `runner_agent` returns it), wrapped so an LLM judge gives its reward when
    `reward.kind` is judge (alight.rewards.judge), with the run's shared score cache in `run_dir`.
    The settings were checked with the agent (`runner_agent` with `check`)."""
    from alight.rewards.kinds import reward_kind

    if not reward_kind(reward).wraps_agent:
        return agent
    from alight.rewards.judge import JudgedAgent
    from alight.rewards.judge_cache import CACHE_FILE

    return JudgedAgent(agent, reward.judge, cache_path=None if run_dir is None else run_dir / CACHE_FILE)


def runner_command(agent: str | LitAgent) -> str:
    """The `alight runner` options that run `agent` (as `runner_agent` returns it) on another machine."""
    import shlex

    from alight.agent import NamedEntrypoint
    from alight.command_agent import CommandAgent

    if isinstance(agent, CommandAgent):
        return f"--command {shlex.quote(shlex.join(agent.command))} --name {shlex.quote(agent.name)}"
    if isinstance(agent, NamedEntrypoint):
        return f"--agent {shlex.quote(agent.entrypoint)} --name {shlex.quote(agent.name)}"
    return f"--agent {agent}"
