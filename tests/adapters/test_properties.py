"""Hypothesis properties of the adapter: agent selection is exact, truncation keeps whole tokens and rewards."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alight.adapters import AdapterStats, SpanAdapter
from tests.adapters.factory import Trace

AGENTS = ["write", "rewrite", "check", "writer", "plan", ""]
PATTERNS = ["write|rewrite", "write", ".*write.*", "check|plan", "(re)?write", ".*"]

ids = st.lists(st.integers(min_value=0, max_value=150_000), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(agents=st.lists(st.sampled_from(AGENTS), max_size=12), pattern=st.sampled_from(PATTERNS))
def test_agent_match_selects_exactly_the_matching_agents(agents: list[str], pattern: str) -> None:
    trace = Trace()
    for i, agent in enumerate(agents):
        trace.llm([1, 2], [i + 1], agent=agent or None)
    stats = AdapterStats()
    out = SpanAdapter(agent_match=pattern).adapt(trace.spans, rollout_id="ro-1", stats=stats)
    expected = [i + 1 for i, agent in enumerate(agents) if re.fullmatch(pattern, agent)]
    assert [t.response_ids[0] for t in out.transitions] == expected
    assert all(re.fullmatch(pattern, t.agent_name or "") for t in out.transitions)
    assert stats.calls_kept + stats.calls_skipped_agent == len(agents)


def _is_contiguous_run(part: list[int], whole: list[int]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(st.tuples(ids, ids, st.floats(-1, 1)), min_size=1, max_size=6),
    max_prompt=st.one_of(st.none(), st.integers(1, 50)),
    max_response=st.one_of(st.none(), st.integers(1, 50)),
    episode=st.floats(-5, 5),
    trajectory=st.booleans(),
)
def test_truncation_never_splits_a_token_and_never_loses_the_reward(
    calls: list[tuple[list[int], list[int], float]],
    max_prompt: int | None,
    max_response: int | None,
    episode: float,
    trajectory: bool,
) -> None:
    trace = Trace()
    for prompt, response, reward in calls:
        trace.llm(prompt, response, logprobs=[-float(i) for i in range(len(response))])
        trace.reward(reward)
    trace.reward(episode, "final")
    mode = "trajectory" if trajectory else "transition"
    full = SpanAdapter(mode=mode).adapt(trace.spans, rollout_id="ro-1")
    stats = AdapterStats()
    cut = SpanAdapter(mode=mode, max_prompt_length=max_prompt, max_response_length=max_response).adapt(
        trace.spans, rollout_id="ro-1", stats=stats
    )
    assert cut.episode_reward == full.episode_reward == episode
    assert cut.intermediate_rewards == full.intermediate_rewards
    assert math.fsum(cut.intermediate_rewards) == pytest.approx(math.fsum(reward for _, _, reward in calls))
    prompt_cut = response_cut = 0
    for short, long in zip(cut.transitions, full.transitions, strict=True):
        assert short.reward == long.reward
        # the prompt keeps its end, the response its start: whole ids, one contiguous run
        assert short.prompt_ids == long.prompt_ids[len(long.prompt_ids) - len(short.prompt_ids) :]
        assert short.response_ids == long.response_ids[: len(short.response_ids)]
        assert _is_contiguous_run(short.prompt_ids, long.prompt_ids)
        assert max_prompt is None or len(short.prompt_ids) == min(max_prompt, len(long.prompt_ids))
        assert max_response is None or len(short.response_ids) == min(max_response, len(long.response_ids))
        assert short.response_logprobs is not None and long.response_logprobs is not None
        assert short.response_logprobs == long.response_logprobs[: len(short.response_ids)]
        if long.response_mask is not None:
            assert short.response_mask == long.response_mask[: len(short.response_ids)]
        prompt_cut += len(long.prompt_ids) - len(short.prompt_ids)
        response_cut += len(long.response_ids) - len(short.response_ids)
    assert (stats.prompt_tokens_cut, stats.response_tokens_cut) == (prompt_cut, response_cut)
