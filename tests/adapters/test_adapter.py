"""SpanAdapter on hand-made span lists: selection, order, rewards, truncation, ids, trajectory mode."""

from __future__ import annotations

import pytest

from alight.adapters import AdapterStats, SpanAdapter
from alight.algorithms import parse_air_rules
from alight.errors import ConfigError
from tests.adapters.factory import Trace


def responses(adapted_transitions: list) -> list[list[int]]:  # type: ignore[type-arg]
    return [t.response_ids for t in adapted_transitions]


def test_agent_match_keeps_only_fully_matching_agents() -> None:
    trace = Trace()
    for i, agent in enumerate(["write", "check", "rewrite", "writer", None]):
        trace.llm([1, 2], [100 + i], agent=agent)
    stats = AdapterStats()
    out = SpanAdapter(agent_match="write|rewrite").adapt(trace.spans, rollout_id="ro-1", reward=1.0, stats=stats)
    assert [t.agent_name for t in out.transitions] == ["write", "rewrite"]
    assert [t.step_index for t in out.transitions] == [0, 1]
    assert stats.llm_calls == 5 and stats.calls_kept == 2 and stats.calls_skipped_agent == 3
    everything = SpanAdapter().adapt(trace.spans, rollout_id="ro-1")
    assert len(everything.transitions) == 5


def test_agent_name_comes_from_the_parent_agent_span_when_the_call_has_none() -> None:
    trace = Trace()
    parent = trace.agent("planner")
    trace.llm([1], [2], agent=None, parent_id=parent.span_id)
    trace.llm([1], [3], agent=None)
    out = SpanAdapter(agent_match="planner").adapt(trace.spans, rollout_id="ro-1")
    assert responses(out.transitions) == [[2]]
    assert out.transitions[0].agent_name == "planner"


def test_calls_are_ordered_by_sequence_id_then_start_time_then_input_order() -> None:
    trace = Trace()
    trace.llm([1], [3], sequence_id=5, start_time=10.0)
    trace.llm([1], [1], sequence_id=2, start_time=50.0)
    trace.llm([1], [2], sequence_id=5, start_time=9.0)  # tie on sequence id: earlier start first
    trace.llm([1], [4], sequence_id=5, start_time=10.0)  # full tie: input order
    out = SpanAdapter().adapt(reversed(trace.spans[::-1]), rollout_id="ro-1")
    assert responses(out.transitions) == [[1], [2], [3], [4]]
    assert [t.span_id for t in out.transitions] == [trace.spans[i].span_id for i in (1, 2, 0, 3)]


def test_spans_without_a_sequence_id_come_last_in_start_order() -> None:
    trace = Trace()
    trace.llm([1], [3], sequence_id=None, start_time=2.0)
    trace.llm([1], [2], sequence_id=None, start_time=1.0)
    trace.llm([1], [1], sequence_id=7)
    assert responses(SpanAdapter().adapt(trace.spans, rollout_id="ro-1").transitions) == [[1], [2], [3]]


def test_dicts_in_span_json_shape_adapt_like_span_objects() -> None:
    trace = Trace()
    trace.llm([1, 2], [3, 4], agent="a")
    trace.reward(0.5)
    trace.tool("run_sql", error=True, sql="select")
    trace.llm([1, 2, 3, 4, 5], [6])
    trace.reward(1.0, name="final")
    adapter = SpanAdapter(tool_reward=parse_air_rules([{"on_error": -0.25}]))
    a = adapter.adapt(trace.spans, rollout_id="ro-1")
    b = adapter.adapt(trace.dicts(), rollout_id="ro-1")
    assert a.transitions == b.transitions and a.intermediate_rewards == b.intermediate_rewards == [0.25, 0.0]
    assert a.episode_reward == b.episode_reward == 1.0


def test_only_the_latest_attempt_is_adapted() -> None:
    old, new = Trace(attempt_id="at-1"), Trace(attempt_id="at-2")
    old.llm([1], [1], start_time=1.0)
    new.llm([1], [2], start_time=5.0)
    stats = AdapterStats()
    out = SpanAdapter().adapt(old.spans + new.spans, rollout_id="ro-1", stats=stats)
    assert responses(out.transitions) == [[2]] and out.transitions[0].attempt_id == "at-2"
    assert stats.spans_other_attempts == 1


@pytest.mark.parametrize(
    ("build", "rollout_reward", "episode", "intermediate"),
    [
        # the agent returned 1.0 (a "final" span) and emitted 0.2 after the first call
        (lambda t: (t.llm([1], [1]), t.reward(0.2), t.llm([1], [2]), t.reward(1.0, "final")), 1.0, 1.0, [0.2, 0.0]),
        # rewards before any call attach to the first call
        (lambda t: (t.reward(0.3), t.llm([1], [1]), t.llm([1], [2]), t.reward(1.0, "final")), 1.0, 1.0, [0.3, 0.0]),
        # no "final" span: the last emitted reward is the episode's own, the earlier ones intermediate
        (lambda t: (t.llm([1], [1]), t.reward(0.1), t.llm([1], [2]), t.reward(0.7)), None, 0.7, [0.1, 0.0]),
        # Rollout.reward wins over the spans
        (lambda t: (t.llm([1], [1]), t.reward(0.4, "final")), 2.0, 2.0, [0.0]),
        # two rewards after the same call add up
        (
            lambda t: (t.llm([1], [1]), t.reward(0.1), t.reward(0.2), t.llm([1], [2]), t.reward(1, "final")),
            None,
            1.0,
            [0.3, 0.0],
        ),
    ],
)
def test_episode_and_mid_episode_rewards(build, rollout_reward, episode, intermediate) -> None:  # type: ignore[no-untyped-def]
    trace = Trace()
    build(trace)
    out = SpanAdapter().adapt(trace.spans, rollout_id="ro-1", reward=rollout_reward)
    assert out.episode_reward == pytest.approx(episode)
    assert out.intermediate_rewards == pytest.approx(intermediate)
    assert [t.reward for t in out.transitions] == pytest.approx(intermediate)


def test_rewards_follow_the_latest_kept_call_not_a_skipped_agent() -> None:
    trace = Trace()
    trace.llm([1], [1], agent="writer")
    trace.llm([1], [2], agent="checker")
    trace.reward(0.5)
    trace.reward(1.0, "final")
    out = SpanAdapter(agent_match="writer").adapt(trace.spans, rollout_id="ro-1")
    assert out.intermediate_rewards == [0.5]


def test_a_rollout_without_reward_or_calls_is_counted() -> None:
    trace = Trace()
    trace.reward(0.5, name="format")
    trace.reward(0.9)
    trace.llm([1], [1], agent="other")
    stats = AdapterStats()
    out = SpanAdapter(agent_match="writer").adapt(trace.spans, rollout_id="ro-1", stats=stats)
    assert out.transitions == [] and out.episode_reward == 0.9
    assert stats.rollouts_without_transitions == 1 and stats.rewards_unattached == 1
    empty = SpanAdapter().adapt([], rollout_id="ro-2", stats=stats)
    assert empty.episode_reward == 0.0 and stats.rollouts_without_reward == 1


def test_air_rewards_attach_to_the_call_that_asked_for_the_tool() -> None:
    trace = Trace()
    trace.tool("setup", error=True)  # before any call: attaches to the first
    trace.llm([1], [1])
    trace.tool("run_sql", error=True, sql="select nope")
    trace.tool("run_sql", sql="select 1")
    trace.llm([1], [2])
    trace.tool("bash", exit_status=2)
    trace.tool("bash", exit_status=0)
    trace.reward(1.0, "final")
    rules = parse_air_rules(
        [
            {"match": {"name": "run_sql"}, "on_error": -0.2, "sql_fails": -0.5, "sql_succeeds": 0.1},
            {"match": {"kind": "tool", "name": "bash|setup"}, "on_error": -0.05, "exit_status_nonzero": -0.1},
        ]
    )
    stats = AdapterStats()
    out = SpanAdapter(tool_reward=rules).adapt(trace.spans, rollout_id="ro-1", stats=stats)
    assert out.intermediate_rewards == pytest.approx([-0.05 - 0.7 + 0.1, -0.1])
    assert stats.air_rewards == 4  # the successful bash call has a total of 0: no reward


def test_truncation_keeps_the_prompt_end_and_the_response_start_and_counts() -> None:
    trace = Trace()
    trace.llm(list(range(10)), [20, 21, 22, 23], logprobs=[-1.0, -2.0, -3.0, -4.0])
    trace.llm([1, 2], [3])
    trace.reward(0.25)
    trace.reward(1.0, "final")
    stats = AdapterStats()
    out = SpanAdapter(max_prompt_length=4, max_response_length=2).adapt(trace.spans, rollout_id="ro-1", stats=stats)
    first, second = out.transitions
    assert first.prompt_ids == [6, 7, 8, 9] and first.response_ids == [20, 21]
    assert first.response_logprobs == [-1.0, -2.0]
    assert second.prompt_ids == [1, 2] and second.response_ids == [3]
    assert out.intermediate_rewards == [0.0, 0.25] and out.episode_reward == 1.0
    assert (stats.prompts_truncated, stats.prompt_tokens_cut) == (1, 6)
    assert (stats.responses_truncated, stats.response_tokens_cut) == (1, 2)


def test_calls_without_ids_are_skipped_without_a_tokenizer_and_bad_logprobs_dropped() -> None:
    trace = Trace()
    trace.llm(None, None, messages=[{"role": "user", "content": "hi"}], reply={"role": "assistant", "content": "yo"})
    trace.llm([1], [], logprobs=False)
    trace.llm([1], [2, 3], logprobs=[-1.0])  # wrong length: treated as missing
    stats = AdapterStats()
    out = SpanAdapter().adapt(trace.spans, rollout_id="ro-1", stats=stats)
    assert responses(out.transitions) == [[2, 3]] and out.transitions[0].response_logprobs is None
    assert stats.calls_skipped_no_ids == 1 and stats.calls_skipped_empty == 1 and stats.logprobs_missing == 1


def test_a_tokenizer_callable_rebuilds_missing_ids() -> None:
    trace = Trace()
    trace.llm(None, None, messages=[{"role": "user", "content": "hi"}], reply={"role": "assistant", "content": "yo"})

    def tokenize(messages, tools, reply):  # type: ignore[no-untyped-def]
        return [len(m["content"]) for m in messages], [ord(c) for c in reply["content"]]

    stats = AdapterStats()
    out = SpanAdapter(tokenizer=tokenize).adapt(trace.spans, rollout_id="ro-1", stats=stats)
    assert out.transitions[0].prompt_ids == [2] and out.transitions[0].response_ids == [ord("y"), ord("o")]
    assert out.transitions[0].response_logprobs is None and stats.calls_retokenized == 1


def test_trajectory_mode_merges_an_agents_calls_and_counts_fallbacks() -> None:
    trace = Trace()
    trace.llm([1, 2], [3, 4], agent="a", logprobs=[-0.1, -0.2])
    trace.llm([9], [8], agent="b")  # another agent in between does not break a's sequence
    trace.tool("t", error=True)
    trace.llm([1, 2, 3, 4, 5, 6], [7], agent="a", logprobs=[-0.3])  # extends a: 5, 6 inserted
    trace.reward(0.5)
    trace.llm([1, 2, 99], [10], agent="a", logprobs=[-0.4])  # does not extend: fallback, new sequence
    trace.reward(1.0, "final")
    stats = AdapterStats()
    adapter = SpanAdapter(mode="trajectory", tool_reward=parse_air_rules([{"on_error": -0.1}]))
    out = adapter.adapt(trace.spans, rollout_id="ro-1", stats=stats)
    merged, other, fresh = out.transitions
    assert merged.prompt_ids == [1, 2] and merged.response_ids == [3, 4, 5, 6, 7]
    assert merged.response_mask == [1, 1, 0, 0, 1]
    assert merged.response_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert merged.metadata == {"calls": 2, "span_ids": [trace.spans[0].span_id, trace.spans[3].span_id]}
    assert other.agent_name == "b" and other.response_mask == [1]
    assert fresh.response_ids == [10] and [t.step_index for t in out.transitions] == [0, 1, 2]
    assert out.intermediate_rewards == pytest.approx([0.5, -0.1, 0.0])
    assert (stats.trajectory_merges, stats.trajectory_fallbacks, stats.calls_kept) == (1, 1, 4)


def test_trajectory_truncation_cuts_the_mask_with_the_response() -> None:
    trace = Trace()
    trace.llm([1], [2, 3], agent="a")
    trace.llm([1, 2, 3, 4], [5, 6], agent="a")
    out = SpanAdapter(mode="trajectory", max_response_length=3).adapt(trace.spans, rollout_id="ro-1")
    (only,) = out.transitions
    assert only.response_ids == [2, 3, 4] and only.response_mask == [1, 1, 0]
    assert only.response_logprobs == [-0.5, -0.5, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "sequence"}, "adapter mode must be one of"),
        ({"agent_match": "("}, "not a valid regex"),
        ({"max_prompt_length": 0}, "max_prompt_length must be at least 1"),
    ],
)
def test_bad_settings_are_config_errors(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message):
        SpanAdapter(**kwargs)
