"""Spans of one attempt -> an ordered list of transitions (the LightningRL unit: one per LLM call).

Pure over plain data: spans may be `Span` objects or dicts in Span's JSON shape, their token ids
and log-probs lists or numpy arrays (which transitions then hold as they are, slicing them when
cut), and nothing here touches a store, a model or a clock. The hot path does a few dict lookups
per span and builds each transition without validation (`Transition.unchecked`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from alight.adapters.calls import LLMCall, truncate_call
from alight.adapters.retokenize import Retokenizer, retokenize
from alight.adapters.spans import (
    SpanData,
    SpanLike,
    agent_spans,
    attributes_of,
    is_final_reward,
    ordered_spans,
    reward_value,
)
from alight.adapters.stats import AdapterStats
from alight.adapters.trajectory import merge_trajectories
from alight.errors import ConfigError
from alight.semconv import (
    AGENT_NAME,
    JUDGE_AGENT,
    LLM_PROMPT_TOKEN_IDS,
    LLM_RESPONSE_LOGPROBS,
    LLM_RESPONSE_TOKEN_IDS,
    LLM_SOURCE,
    LLM_SOURCE_OTEL,
)
from alight.types import Transition

#: Adapter modes: one transition per LLM call, or an agent's calls merged into one masked sequence.
MODES = ("transition", "trajectory")

_EMPTY: Mapping[str, Any] = {}

#: An automatic intermediate reward source: (tool name, span status, attributes, agent) -> reward or None.
ToolReward = Callable[[str, str, Mapping[str, Any], "str | None"], "float | None"]


@dataclass(slots=True)
class AdaptedRollout:
    """One rollout's transitions in attempt order, with its rewards before credit assignment."""

    rollout_id: str
    group_id: str | None
    episode_reward: float  # Rollout.reward, else the "final" (or last) reward span, else 0.0
    transitions: list[Transition] = field(default_factory=list)
    intermediate_rewards: list[float] = field(default_factory=list)  # per transition: attached rewards


def _has_proxy_calls(spans: list[SpanData]) -> bool:
    return any(s.get("kind") == "llm" and attributes_of(s).get(LLM_SOURCE) == "proxy" for s in spans)


class SpanAdapter:
    """Turns the spans of one attempt into transitions; built once, used for every rollout.

    - Keeps the LLM calls whose agent name fully matches `agent_match` (`re.fullmatch`; a call
      without an agent name is matched as ""; None keeps every call). An LLM judge's calls
      (agent `semconv.JUDGE_AGENT`, reward.kind=judge) are recorded but never kept.
    - Orders them by sequence id (ties: start time, then input order).
    - Uses the span's token ids; when they are missing and a `tokenizer` is given, rebuilds them
      from the messages (`alight.adapters.retokenize`), else skips the call. All counted in stats.
      An OTel GenAI span without ids (`llm.source` "otel") in an attempt where the proxy recorded
      calls is skipped as one (it reports a call the proxy's span holds with token ids).
    - Attaches every mid-episode reward span (any reward span but the episode's own, see
      `episode_reward`) and every `tool_reward` (AIR) to the latest kept call before it in order;
      rewards before the first kept call attach to the first. Each transition's `reward` holds its
      attached rewards until credit assignment replaces it.
    - `mode="trajectory"` merges an agent's successive calls (`merge_trajectories`).
    - Cuts prompts to their last `max_prompt_length` ids and responses to their first
      `max_response_length` ids (`truncate_call`), counting what was cut.
    """

    def __init__(
        self,
        *,
        agent_match: str | None = None,
        mode: str = "transition",
        max_prompt_length: int | None = None,
        max_response_length: int | None = None,
        tokenizer: Retokenizer | None = None,
        tool_reward: ToolReward | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"adapter mode must be one of {', '.join(MODES)}, got {mode!r}")
        for name, value in (("max_prompt_length", max_prompt_length), ("max_response_length", max_response_length)):
            if value is not None and value < 1:
                raise ConfigError(f"adapter {name} must be at least 1, got {value}")
        try:
            self._pattern = None if agent_match is None else re.compile(agent_match)
        except re.error as err:
            raise ConfigError(f"adapter agent_match {agent_match!r} is not a valid regex: {err}") from None
        self.agent_match = agent_match
        self.mode = mode
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.tokenizer = tokenizer
        self.tool_reward = tool_reward
        self._matches: dict[str | None, bool] = {}

    def matches(self, agent_name: str | None) -> bool:
        """Whether calls of this agent are trained on (never the LLM judge's, `JUDGE_AGENT`)."""
        known = self._matches.get(agent_name)
        if known is None:
            known = agent_name != JUDGE_AGENT and (
                self._pattern is None or self._pattern.fullmatch(agent_name or "") is not None
            )
            self._matches[agent_name] = known
        return known

    def adapt(
        self,
        spans: Iterable[SpanLike],
        *,
        rollout_id: str,
        group_id: str | None = None,
        reward: float | None = None,
        stats: AdapterStats | None = None,
    ) -> AdaptedRollout:
        """The transitions of one attempt's spans; `reward` is the rollout's episode reward (Rollout.reward)."""
        stats = AdapterStats() if stats is None else stats
        ordered, dropped = ordered_spans(spans)
        stats.rollouts += 1
        stats.spans_other_attempts += dropped
        calls, rewards, early, air_count = self._collect(ordered, stats)
        episode = _attach_rewards(calls, reward, rewards, early, air_count, stats)
        if self.mode == "trajectory":
            calls, merges, fallbacks = merge_trajectories(calls)
            stats.trajectory_merges += merges
            stats.trajectory_fallbacks += fallbacks
        attempt_id = ordered[0].get("attempt_id") if ordered else None
        return self._finish(calls, rollout_id, attempt_id, group_id, episode, stats)

    def _collect(
        self, ordered: list[SpanData], stats: AdapterStats
    ) -> tuple[list[LLMCall], list[tuple[int, float, SpanData]], float, int]:
        """One pass over an attempt's ordered spans: (kept calls, reward spans as (latest kept call index,
        value, span), AIR rewards seen before the first kept call, AIR reward count); AIR rewards after
        a kept call are already added to it."""
        calls: list[LLMCall] = []
        early, air_count = 0.0, 0  # rewards seen before the first kept call; AIR rewards of this rollout
        rewards: list[tuple[int, float, SpanData]] = []  # (latest kept call index, value, span)
        agents: dict[str, str] | None = None
        proxied: bool | None = None  # whether the proxy recorded LLM calls in this attempt (asked lazily)
        tool_reward, known_agents = self.tool_reward, self._matches
        n_llm = n_skipped = 0
        # The hot loop: plain dict lookups, local counters; anything unusual goes to `_call`.
        for span in ordered:
            kind = span.get("kind")
            if kind == "llm":
                n_llm += 1
                attributes = span.get("attributes") or _EMPTY
                agent = attributes.get(AGENT_NAME)
                if agent is None and span.get("parent_id") is not None:
                    agents = agent_spans(ordered) if agents is None else agents
                    agent = agents.get(span["parent_id"])
                keep = known_agents.get(agent)
                if not (self.matches(agent) if keep is None else keep):
                    n_skipped += 1
                    continue
                prompt = attributes.get(LLM_PROMPT_TOKEN_IDS)
                response = attributes.get(LLM_RESPONSE_TOKEN_IDS)
                logprobs = attributes.get(LLM_RESPONSE_LOGPROBS)
                # len(), never truthiness: the ids may be numpy arrays (`SqliteStore.span_dicts(arrays=True)`).
                if (
                    prompt is not None
                    and response is not None
                    and logprobs is not None
                    and len(prompt)
                    and len(logprobs) == len(response) > 0
                ):
                    calls.append(LLMCall(prompt, response, logprobs, agent, span.get("span_id")))
                else:
                    if prompt is None and attributes.get(LLM_SOURCE) == LLM_SOURCE_OTEL:
                        # An OTel GenAI span reports a call; when the proxy recorded calls, those are the calls.
                        proxied = _has_proxy_calls(ordered) if proxied is None else proxied
                        if proxied:
                            stats.calls_skipped_no_ids += 1
                            continue
                    call = self._call(span, attributes, agent, stats)
                    if call is not None:
                        calls.append(call)
            elif kind == "reward":
                value = reward_value(span)
                if value is not None:
                    rewards.append((len(calls) - 1, value, span))
            elif kind == "tool" and tool_reward is not None:
                attributes = attributes_of(span)
                agent = attributes.get(AGENT_NAME)
                value = tool_reward(span.get("name") or "", str(span.get("status") or "unset"), attributes, agent)
                if value is not None:
                    air_count += 1
                    if calls:
                        calls[-1].reward += value
                    else:
                        early += value
        stats.llm_calls += n_llm
        stats.calls_skipped_agent += n_skipped
        return calls, rewards, early, air_count

    def _call(self, span: SpanData, attributes: Mapping[str, Any], agent: Any, stats: AdapterStats) -> LLMCall | None:
        prompt = attributes.get(LLM_PROMPT_TOKEN_IDS)
        response = attributes.get(LLM_RESPONSE_TOKEN_IDS)
        logprobs = attributes.get(LLM_RESPONSE_LOGPROBS)
        if prompt is None or response is None:
            ids = None if self.tokenizer is None else retokenize(self.tokenizer, attributes)
            if ids is None:
                stats.calls_skipped_no_ids += 1
                return None
            prompt, response = ids
            logprobs = None
            stats.calls_retokenized += 1
        if not len(prompt) or not len(response):
            stats.calls_skipped_empty += 1
            return None
        if logprobs is None or len(logprobs) != len(response):
            logprobs = None
            stats.logprobs_missing += 1
        return LLMCall(prompt, response, logprobs, None if agent is None else str(agent), span.get("span_id"))

    def _finish(
        self,
        calls: list[LLMCall],
        rollout_id: str,
        attempt_id: str | None,
        group_id: str | None,
        episode: float,
        stats: AdapterStats,
    ) -> AdaptedRollout:
        out = AdaptedRollout(rollout_id, group_id, episode)
        if not calls:
            stats.rollouts_without_transitions += 1
            return out
        stats.calls_kept += sum(1 if c.span_ids is None else len(c.span_ids) for c in calls)
        max_prompt, max_response = self.max_prompt_length, self.max_response_length
        transitions, intermediate = out.transitions, out.intermediate_rewards
        unchecked = Transition.unchecked
        for step, call in enumerate(calls):
            if max_prompt is not None or max_response is not None:
                prompt_cut, response_cut = truncate_call(call, max_prompt, max_response)
                if prompt_cut:
                    stats.prompts_truncated += 1
                    stats.prompt_tokens_cut += prompt_cut
                if response_cut:
                    stats.responses_truncated += 1
                    stats.response_tokens_cut += response_cut
            metadata = None if call.span_ids is None else {"calls": len(call.span_ids), "span_ids": call.span_ids}
            transitions.append(
                unchecked(
                    call.prompt_ids,
                    call.response_ids,
                    call.reward,
                    rollout_id,
                    response_logprobs=call.logprobs,
                    agent_name=call.agent_name,
                    step_index=step,
                    attempt_id=attempt_id,
                    group_id=group_id,
                    span_id=call.span_id,
                    metadata=metadata,
                    response_mask=call.mask,
                )
            )
            intermediate.append(call.reward)
        stats.transitions += len(transitions)
        return out


def _attach_rewards(
    calls: list[LLMCall],
    rollout_reward: float | None,
    rewards: list[tuple[int, float, SpanData]],
    early: float,
    air_count: int,
    stats: AdapterStats,
) -> float:
    """Adds each intermediate reward to its call (those before the first kept call, and `early`, to the
    first call) and returns the episode reward (0.0 when the attempt has none)."""
    episode, intermediate = episode_reward(rollout_reward, rewards)
    if episode is None:
        stats.rollouts_without_reward += 1
        episode = 0.0
    for index, value in intermediate:
        stats.intermediate_rewards += 1
        if index >= 0:
            calls[index].reward += value
        else:
            early += value
    stats.air_rewards += air_count
    if calls:
        calls[0].reward += early
    else:
        stats.rewards_unattached += len(intermediate) + air_count
    return episode


def episode_reward(
    rollout_reward: float | None, rewards: list[tuple[int, float, SpanData]]
) -> tuple[float | None, list[tuple[int, float]]]:
    """(episode reward, intermediate rewards) from the rollout's reward and its reward spans in order.

    The runner writes the value an agent returns as a reward span named "final" and, when the agent
    returns nothing, makes the last emitted reward the rollout's reward. So: with a "final" span,
    every other reward span is intermediate; without one, the last reward span is the episode's
    own and the earlier ones are intermediate. The episode reward is `rollout_reward` when given,
    else the last "final" span's value, else the last reward span's value, else None.
    """
    finals = [value for _, value, view in rewards if is_final_reward(view)]
    if finals:
        intermediate = [(index, value) for index, value, view in rewards if not is_final_reward(view)]
        own: float | None = finals[-1]
    elif rewards:
        intermediate = [(index, value) for index, value, _ in rewards[:-1]]
        own = rewards[-1][1]
    else:
        intermediate, own = [], None
    return (own if rollout_reward is None else float(rollout_reward)), intermediate
