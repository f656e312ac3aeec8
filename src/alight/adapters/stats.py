"""Counts of what the adapter kept, skipped, cut and merged: nothing is dropped silently."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class AdapterStats:
    """Counters over every rollout adapted with the same stats object (add two with `+=`)."""

    rollouts: int = 0  # rollouts adapted
    rollouts_without_reward: int = 0  # neither Rollout.reward nor a reward span: episode reward taken as 0
    rollouts_without_transitions: int = 0  # no LLM call kept: the rollout adds nothing to the batch
    spans_other_attempts: int = 0  # spans of other attempts than the adapted one, ignored
    llm_calls: int = 0  # LLM spans seen
    calls_kept: int = 0  # LLM calls turned into (or merged into) transitions
    calls_skipped_agent: int = 0  # agent name does not match `agent_match`
    calls_skipped_no_ids: int = 0  # no token ids and no tokenizer (or the template refused the messages)
    calls_skipped_empty: int = 0  # an empty prompt or response
    calls_retokenized: int = 0  # token ids rebuilt from the messages with the tokenizer
    logprobs_missing: int = 0  # kept calls without usable log-probs (the backend recomputes them)
    prompts_truncated: int = 0  # transitions whose prompt lost its first tokens
    prompt_tokens_cut: int = 0
    responses_truncated: int = 0  # transitions whose response lost its last tokens
    response_tokens_cut: int = 0
    intermediate_rewards: int = 0  # mid-episode reward spans attached to a call
    air_rewards: int = 0  # automatic intermediate rewards (AIR) from tool spans attached to a call
    rewards_unattached: int = 0  # intermediate rewards of rollouts without a kept call: lost
    trajectory_merges: int = 0  # trajectory mode: calls appended to the previous call of their agent
    trajectory_fallbacks: int = 0  # trajectory mode: the prompt did not extend the agent's sequence
    transitions: int = 0  # transitions produced
    groups: int = 0  # groups the advantages were computed over
    singleton_groups: int = 0  # groups of one rollout: advantage 0 (no baseline to compare with)

    def __iadd__(self, other: AdapterStats) -> AdapterStats:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))
        return self

    def as_dict(self) -> dict[str, int]:
        """Every counter by name."""
        return {item.name: getattr(self, item.name) for item in fields(self)}
