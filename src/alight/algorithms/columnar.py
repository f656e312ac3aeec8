"""The columnar fast path of LightningRL: stored LLM calls -> `TransitionBatch` with no Python object
per span or per transition.

`LightningRL.batch_from_store` reads the rollouts as columns (`Store.llm_columns`) and does
here, with numpy over every call of the step at once, what `SpanAdapter.adapt`, credit assignment
and `TransitionBatch.from_transitions` do one object at a time: agent_match (the regex runs once
per distinct agent name), truncation (lengths and offsets), step indices (cumulative counts),
credit and advantages. A rollout whose spans hold anything this path does not model (an LLM span
with ids in its JSON or none, an empty or mismatched id run, an agent known only from its parent
span, a mid-episode reward, an AIR reward, two spans with one sequence id) is adapted by the object
path instead, and its transitions join the others in rollout order: the batch is the one the object
path makes, tensor for tensor.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from alight.adapters import AdaptedRollout, AdapterStats, SpanAdapter
from alight.adapters.spans import is_final_reward, reward_value
from alight.algorithms.advantages import compute_advantages, group_index
from alight.algorithms.credit import Credit
from alight.semconv import AGENT_NAME, JUDGE_AGENT
from alight.store.columns import LLMColumns

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


@dataclass(slots=True)
class Rows:
    """Transitions as columns, grouped by rollout in step order: token runs are (start, length) in flat arrays."""

    rollout: Ints  # index of each row's rollout
    prompt: npt.NDArray[Any]
    prompt_start: Ints
    prompt_length: Ints
    response: npt.NDArray[Any]
    logprobs: npt.NDArray[Any]  # log-probs; each row's run starts at `logprob_start`, `response_length` long
    logprob_start: Ints
    response_start: Ints
    response_length: Ints
    has_logprobs: npt.NDArray[np.bool_]
    agents: list[str | None]
    span_ids: list[str | None]
    attempt_ids: list[str | None]
    group_ids: list[str | None]
    step: Ints
    intermediate: Floats  # rewards attached to each transition before credit assignment


def fast_rollouts(adapter: SpanAdapter, cols: LLMColumns) -> tuple[npt.NDArray[np.bool_], list[float | None]]:
    """Per rollout: whether the columns tell all the object path would read of it, and the episode
    reward its reward spans give (the last "final" one, else the last one; None: no reward span)."""
    n = len(cols.rollout_ids)
    slow = np.zeros(n, dtype=np.bool_)
    index = cols.rollout_index
    bad = (cols.prompt_lengths == 0) | (cols.response_lengths == 0) | (cols.logprob_lengths != cols.response_lengths)
    slow[index[bad]] = True
    if None in set(cols.agents):  # an agent named only by its parent agent span
        orphan = [a is None and p is not None for a, p in zip(cols.agents, cols.parent_ids, strict=True)]
        slow[index[np.asarray(orphan, dtype=np.bool_)]] = True
    tool_reward = adapter.tool_reward
    # Per rollout: its reward spans' values, how many of them are "final", the episode's own value.
    count, finals = [0] * n, [0] * n
    own: list[float | None] = [None] * n
    for i, span in cols.other_spans:
        kind = span.get("kind")
        if kind == "reward":
            value = reward_value(span)
            if value is not None:
                count[i] += 1
                if is_final_reward(span):
                    finals[i] += 1
                    own[i] = value
                elif not finals[i]:
                    own[i] = value
        elif kind == "llm":
            slow[i] = True
        elif kind == "tool" and tool_reward is not None:
            attributes = span.get("attributes") or {}
            name, status = span.get("name") or "", str(span.get("status") or "unset")
            if tool_reward(name, status, attributes, attributes.get(AGENT_NAME)) is not None:
                slow[i] = True
    for i, (total, final) in enumerate(zip(count, finals, strict=True)):
        if total > 1 and final != total:  # a mid-episode reward: a reward span that is not the episode's own
            slow[i] = True
    # Two spans of one attempt with one sequence id: their order is the object path's to decide.
    other_index, other_seq = cols.other_index, cols.other_sequence_ids
    both_index, both_seq = np.concatenate([index, other_index]), np.concatenate([cols.sequence_ids, other_seq])
    if len(both_index) > 1:
        order = np.lexsort((both_seq, both_index))
        same = (np.diff(both_index[order]) == 0) & (np.diff(both_seq[order]) == 0)
        slow[both_index[order][1:][same]] = True
    return ~slow, own


def fast_rows(
    adapter: SpanAdapter, cols: LLMColumns, fast: npt.NDArray[np.bool_], own: list[float | None], stats: AdapterStats
) -> tuple[Rows, Floats]:
    """The transitions of the `fast` rollouts and every rollout's episode reward (0.0 for the others),
    counted in `stats` as `SpanAdapter.adapt` counts them."""
    n = len(cols.rollout_ids)
    index = cols.rollout_index
    in_fast = fast[index]
    keep = in_fast
    names = set(cols.agents)
    if adapter.agent_match is not None or JUDGE_AGENT in names:  # an LLM judge's calls are never trained on
        matched = {agent: adapter.matches(agent) for agent in names}
        keep = in_fast & np.fromiter(map(matched.__getitem__, cols.agents), dtype=np.bool_, count=len(cols.agents))
    n_fast = int(fast.sum())
    stats.rollouts += n_fast
    stats.llm_calls += int(in_fast.sum())
    stats.calls_skipped_agent += int(in_fast.sum() - keep.sum())
    episode = np.zeros(n, dtype=np.float64)
    for i in np.flatnonzero(fast).tolist():
        value = cols.rewards[i] if cols.rewards[i] is not None else own[i]
        if value is None:
            stats.rollouts_without_reward += 1
        else:
            episode[i] = float(value)
    rows = np.flatnonzero(keep)
    rollout = index[rows]
    counts = np.bincount(rollout, minlength=n)
    stats.rollouts_without_transitions += int((counts[fast] == 0).sum())
    stats.calls_kept += len(rows)
    stats.transitions += len(rows)
    prompt_start = (np.cumsum(cols.prompt_lengths) - cols.prompt_lengths)[rows]
    response_start = (np.cumsum(cols.response_lengths) - cols.response_lengths)[rows]
    prompt_length, response_length = cols.prompt_lengths[rows], cols.response_lengths[rows]
    if adapter.max_prompt_length is not None:
        cut = np.maximum(prompt_length - adapter.max_prompt_length, 0)
        stats.prompts_truncated += int((cut > 0).sum())
        stats.prompt_tokens_cut += int(cut.sum())
        prompt_start, prompt_length = prompt_start + cut, prompt_length - cut
    if adapter.max_response_length is not None:
        cut = np.maximum(response_length - adapter.max_response_length, 0)
        stats.responses_truncated += int((cut > 0).sum())
        stats.response_tokens_cut += int(cut.sum())
        response_length = response_length - cut
    firsts = np.cumsum(counts) - counts
    every = len(rows) == len(index)  # every call kept: the columns as they are
    agents = list(cols.agents) if every else np.asarray(cols.agents, dtype=object)[rows].tolist()
    span_ids = list(cols.span_ids) if every else np.asarray(cols.span_ids, dtype=object)[rows].tolist()
    attempts, groups = np.asarray(cols.attempt_ids, dtype=object), np.asarray(cols.group_ids, dtype=object)
    out = Rows(
        rollout=rollout,
        prompt=cols.prompt_ids,
        prompt_start=prompt_start,
        prompt_length=prompt_length,
        response=cols.response_ids,
        logprobs=cols.logprobs,
        logprob_start=(np.cumsum(cols.logprob_lengths) - cols.logprob_lengths)[rows],
        response_start=response_start,
        response_length=response_length,
        has_logprobs=np.ones(len(rows), dtype=np.bool_),
        agents=agents,
        span_ids=span_ids,
        attempt_ids=attempts[rollout].tolist(),
        group_ids=groups[rollout].tolist(),
        step=np.arange(len(rows), dtype=np.int64) - firsts[rollout],
        intermediate=np.zeros(len(rows), dtype=np.float64),
    )
    return out, episode


def object_rows(adapted: Sequence[tuple[int, AdaptedRollout]]) -> Rows:
    """The transitions of rollouts adapted by the object path (index of each rollout, its adaptation)."""
    transitions = [
        (i, t, reward) for i, a in adapted for t, reward in zip(a.transitions, a.intermediate_rewards, strict=True)
    ]
    prompts = [np.asarray(t.prompt_ids, dtype=np.int64) for _, t, _ in transitions]
    responses = [np.asarray(t.response_ids, dtype=np.int64) for _, t, _ in transitions]
    logprobs = [
        np.zeros(len(r)) if t.response_logprobs is None else np.asarray(t.response_logprobs, dtype=np.float64)
        for (_, t, _), r in zip(transitions, responses, strict=True)
    ]
    prompt_length = np.array([len(p) for p in prompts], dtype=np.int64)
    response_length = np.array([len(r) for r in responses], dtype=np.int64)
    return Rows(
        rollout=np.array([i for i, _, _ in transitions], dtype=np.int64),
        prompt=_joined(prompts, np.int64),
        prompt_start=np.cumsum(prompt_length) - prompt_length,
        prompt_length=prompt_length,
        response=_joined(responses, np.int64),
        logprobs=_joined(logprobs, np.float64),
        logprob_start=np.cumsum(response_length) - response_length,
        response_start=np.cumsum(response_length) - response_length,
        response_length=response_length,
        has_logprobs=np.array([t.response_logprobs is not None for _, t, _ in transitions], dtype=np.bool_),
        agents=[t.agent_name for _, t, _ in transitions],
        span_ids=[t.span_id for _, t, _ in transitions],
        attempt_ids=[t.attempt_id for _, t, _ in transitions],
        group_ids=[t.group_id for _, t, _ in transitions],
        step=np.array([t.step_index for _, t, _ in transitions], dtype=np.int64),
        intermediate=np.array([reward for _, _, reward in transitions], dtype=np.float64),
    )


def _joined(parts: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def merge_rows(a: Rows, b: Rows) -> Rows:
    """The rows of both, in rollout order (a rollout's rows come from one of them)."""
    order = np.argsort(np.concatenate([a.rollout, b.rollout]), kind="stable")
    picks = order.tolist()

    def pick(x: list[Any], y: list[Any]) -> list[Any]:
        both = x + y
        return [both[i] for i in picks]

    def cat(x: npt.NDArray[Any], y: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.concatenate([x, y])[order]

    prompt_shift, response_shift = len(a.prompt), len(a.response)
    return Rows(
        rollout=cat(a.rollout, b.rollout),
        prompt=np.concatenate([a.prompt, b.prompt]),
        prompt_start=cat(a.prompt_start, b.prompt_start + prompt_shift),
        prompt_length=cat(a.prompt_length, b.prompt_length),
        response=np.concatenate([a.response, b.response]),
        logprobs=np.concatenate([a.logprobs, b.logprobs]),
        logprob_start=cat(a.logprob_start, b.logprob_start + len(a.logprobs)),
        response_start=cat(a.response_start, b.response_start + response_shift),
        response_length=cat(a.response_length, b.response_length),
        has_logprobs=cat(a.has_logprobs, b.has_logprobs),
        agents=pick(a.agents, b.agents),
        span_ids=pick(a.span_ids, b.span_ids),
        attempt_ids=pick(a.attempt_ids, b.attempt_ids),
        group_ids=pick(a.group_ids, b.group_ids),
        step=cat(a.step, b.step),
        intermediate=cat(a.intermediate, b.intermediate),
    )


def runs(flat: npt.NDArray[Any], starts: Ints, lengths: Ints) -> npt.NDArray[Any]:
    """The runs (start, length) of `flat` one after another (`flat` itself when they already are)."""
    total = int(lengths.sum())
    if total == len(flat) and (len(starts) == 0 or (starts == np.cumsum(lengths) - lengths).all()):
        return flat
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return flat[offsets + np.arange(total)]


def credit_columns(
    rows: Rows,
    episode: Floats,
    intermediate_sums: Floats,
    rollout_ids: Sequence[str],
    group_ids: Sequence[str | None],
    credit: Credit,
    *,
    estimator: str,
    norm_std: bool,
    eps: float,
    stats: AdapterStats,
) -> tuple[Floats, Floats]:
    """(reward, advantage) per row, as `credit_and_advantages` sets them on the same transitions;
    `intermediate_sums` is each rollout's `math.fsum` of its intermediate rewards."""
    counts = np.bincount(rows.rollout, minlength=len(rollout_ids))
    active = np.flatnonzero(counts)
    groups: list[Hashable] = [
        ("rollout", rollout_ids[i]) if group_ids[i] is None else group_ids[i] for i in active.tolist()
    ]
    sizes: dict[Hashable, int] = {}
    for group in groups:
        sizes[group] = sizes.get(group, 0) + 1
    stats.groups += len(sizes)
    stats.singleton_groups += sum(1 for size in sizes.values() if size == 1)
    if not len(active):
        return np.zeros(0), np.zeros(0)
    active_counts = counts[active]
    if not credit.per_transition:
        returns = episode[active] + intermediate_sums[active]
        advantages = compute_advantages(estimator, returns, groups, norm_std=norm_std, eps=eps)
        rewards, values = np.repeat(returns, active_counts), np.repeat(advantages, active_counts)
        if credit.final_only:
            final = np.zeros(len(rewards), dtype=np.bool_)
            final[np.cumsum(active_counts) - 1] = True
            rewards, values = np.where(final, rewards, 0.0), np.where(final, values, 0.0)
        return rewards, values
    rewards = discounted_columns(rows, episode, credit.gamma)
    group_numbers, _ = group_index(groups)
    units = np.repeat(np.arange(len(active)), active_counts).tolist()
    values = compute_advantages(
        estimator, rewards, np.repeat(group_numbers, active_counts).tolist(), units=units, norm_std=norm_std, eps=eps
    )
    return rewards, values


def discounted_columns(rows: Rows, episode: Floats, gamma: float) -> Floats:
    """`discounted_credit` of every rollout at once, with the same float operations in the same order."""
    n = len(rows.rollout)
    out = np.zeros(n, dtype=np.float64)
    if not n:
        return out
    last = np.ones(n, dtype=np.bool_)
    last[:-1] = rows.rollout[1:] != rows.rollout[:-1]
    ends = np.flatnonzero(last)
    out[ends] = rows.intermediate[ends] + episode[rows.rollout[ends]]
    counts = np.bincount(rows.rollout)
    to_end = np.repeat(np.cumsum(counts[counts > 0]) - 1, counts[counts > 0]) - np.arange(n)  # rows after this one
    for distance in range(1, int(to_end.max()) + 1):
        at = np.flatnonzero(to_end == distance)
        out[at] = rows.intermediate[at] + gamma * out[at + 1]
    return out
