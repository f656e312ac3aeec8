"""LightningRL: rollouts' spans -> credited transitions with advantages -> a `TransitionBatch`.

The trainer and tools (`alight trace --transitions`, the adapter benchmark) use one entry point:

    rl = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=tokenizer)
    transitions, stats = rl.adapt_rollouts(rollouts, spans_by_rollout)
    batch = rl.batch(transitions, pad_id=tokenizer.pad_token_id)

Steps: the adapter (`alight.adapters.SpanAdapter`) cuts each rollout's spans into transitions
and attaches intermediate rewards (mid-episode reward spans, AIR); credit assignment
(`alight.algorithms.credit`) gives each transition its reward; the estimator
(`alight.algorithms.advantages`) gives it its advantage, per rollout or per transition as the
credit mode says. Only rollouts with at least one transition take part in their group's statistics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from alight.adapters import AdaptedRollout, AdapterStats, Retokenizer, SpanAdapter, SpanLike
from alight.algorithms import columnar
from alight.algorithms.advantages import ESTIMATORS, compute_advantages, group_index
from alight.algorithms.air import parse_air_rules
from alight.algorithms.batch import TransitionBatch
from alight.algorithms.credit import Credit, make_credit
from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.errors import ConfigError
from alight.store.base import Store
from alight.store.columns import LLMColumns, gc_paused
from alight.types import Rollout, Transition


class LightningRL:
    """The span -> transition -> batch pipeline for one experiment's adapter and algorithm settings."""

    def __init__(
        self,
        adapter: SpanAdapter,
        credit: Credit,
        *,
        advantage: str = "grpo",
        norm_std: bool = True,
        eps: float = 1e-6,
    ) -> None:
        if advantage not in ESTIMATORS:
            raise ConfigError(f"algorithm advantage must be one of {', '.join(ESTIMATORS)}, got {advantage!r}")
        if not eps > 0:
            raise ConfigError(f"algorithm eps must be positive, got {eps}")
        self.adapter = adapter
        self.credit = credit
        self.advantage = advantage
        self.norm_std = norm_std
        self.eps = eps

    @classmethod
    def from_config(
        cls,
        adapter: AdapterConfig | None = None,
        algorithm: AlgorithmConfig | None = None,
        *,
        tokenizer: Retokenizer | None = None,
    ) -> LightningRL:
        """The pipeline the config groups describe; `tokenizer` (a Hugging Face tokenizer or a
        `TokenizeFn`) re-tokenises calls recorded without token ids. ConfigError for bad settings."""
        adapter = AdapterConfig() if adapter is None else adapter
        algorithm = AlgorithmConfig() if algorithm is None else algorithm
        air = parse_air_rules(list(adapter.air or []))
        span_adapter = SpanAdapter(
            agent_match=adapter.agent_match,
            mode=adapter.mode,
            max_prompt_length=adapter.max_prompt_length,
            max_response_length=adapter.max_response_length,
            tokenizer=tokenizer,
            tool_reward=air if air else None,
        )
        return cls(
            span_adapter,
            make_credit(adapter.credit, gamma=adapter.gamma),
            advantage=algorithm.advantage,
            norm_std=algorithm.norm_std,
            eps=algorithm.eps,
        )

    def adapt_rollouts(
        self,
        rollouts: Sequence[Rollout | Mapping[str, Any]],
        spans_by_rollout: Mapping[str, Iterable[SpanLike]],
    ) -> tuple[list[Transition], AdapterStats]:
        """Transitions of every rollout (rollout order, then step order) with rewards and advantages set.

        `rollouts` are `Rollout`s or dicts with rollout_id, group_id and reward (Rollout.reward);
        `spans_by_rollout` maps a rollout id to the spans of its attempt (a missing id: no spans).
        """
        stats = AdapterStats()
        with gc_paused():
            adapted = [self._adapt_one(rollout, spans_by_rollout, stats) for rollout in rollouts]
            return self.assign(adapted, stats), stats

    def _adapt_one(
        self,
        rollout: Rollout | Mapping[str, Any],
        spans_by_rollout: Mapping[str, Iterable[SpanLike]],
        stats: AdapterStats,
    ) -> AdaptedRollout:
        if isinstance(rollout, Mapping):
            rollout_id, group_id, reward = rollout["rollout_id"], rollout.get("group_id"), rollout.get("reward")
        else:
            rollout_id, group_id, reward = rollout.rollout_id, rollout.group_id, rollout.reward
        spans = spans_by_rollout.get(rollout_id, ())
        return self.adapter.adapt(spans, rollout_id=rollout_id, group_id=group_id, reward=reward, stats=stats)

    def assign(self, adapted: Sequence[AdaptedRollout], stats: AdapterStats | None = None) -> list[Transition]:
        """Set `reward` (credit assignment) and `advantage` on the adapted rollouts' transitions; return them all."""
        return credit_and_advantages(
            adapted, self.credit, estimator=self.advantage, norm_std=self.norm_std, eps=self.eps, stats=stats
        )

    def batch(self, transitions: Sequence[Transition], pad_id: int) -> TransitionBatch:
        """The backend batch of `transitions` (see `TransitionBatch.from_transitions`)."""
        with gc_paused():
            return TransitionBatch.from_transitions(transitions, pad_id)

    @property
    def columnar(self) -> bool:
        """Whether `batch_from_store` can build this pipeline's batch as columns (transition mode,
        a built-in credit mode); otherwise it adapts every rollout as objects."""
        return self.adapter.mode == "transition" and self.credit.user_fn is None

    async def batch_from_store(
        self, store: Store, rollout_ids: Sequence[str], pad_id: int
    ) -> tuple[TransitionBatch | None, AdapterStats]:
        """The batch of the stored rollouts' latest attempts (None: no transition) and the adapter's counts.

        The same batch and counts as `adapt_rollouts` then `batch` over `store.rollout_dicts(ids)` and
        `store.span_dicts(ids, arrays=True)`, from any store (memory, SQLite, a store server over
        HTTP). When `columnar` holds, built from the store's `llm_columns` with numpy over every call
        at once (`alight.algorithms.columnar`), rollouts the columns cannot describe being adapted as
        objects. Duplicate ids count once.
        """
        ids = list(dict.fromkeys(rollout_ids))
        if not self.columnar:
            rollouts, spans = await store.rollout_dicts(ids), await store.span_dicts(ids, arrays=True)
            transitions, stats = self.adapt_rollouts(rollouts, spans)
            return (self.batch(transitions, pad_id) if transitions else None), stats
        with gc_paused():
            columns = await store.llm_columns(ids, tool_spans=self.adapter.tool_reward is not None)
            return await self.batch_from_columns(store, columns, pad_id)

    async def batch_from_columns(
        self, store: Store, cols: LLMColumns, pad_id: int
    ) -> tuple[TransitionBatch | None, AdapterStats]:
        """`batch_from_store` once the columns are read (`store` serves the rollouts adapted as objects)."""
        stats = AdapterStats()
        fast, own = columnar.fast_rollouts(self.adapter, cols)
        rows, episode = columnar.fast_rows(self.adapter, cols, fast, own, stats)
        sums = np.zeros(len(cols.rollout_ids), dtype=np.float64)
        slow = np.flatnonzero(~fast).tolist()
        if slow:
            spans = await store.span_dicts([cols.rollout_ids[i] for i in slow], arrays=True)
            adapted = []
            for i in slow:
                rollout_id = cols.rollout_ids[i]
                one = self.adapter.adapt(
                    spans[rollout_id],
                    rollout_id=rollout_id,
                    group_id=cols.group_ids[i],
                    reward=cols.rewards[i],
                    stats=stats,
                )
                episode[i], sums[i] = one.episode_reward, math.fsum(one.intermediate_rewards)
                adapted.append((i, one))
            rows = columnar.merge_rows(rows, columnar.object_rows(adapted))
        rewards, advantages = columnar.credit_columns(
            rows,
            episode,
            sums,
            cols.rollout_ids,
            cols.group_ids,
            self.credit,
            estimator=self.advantage,
            norm_std=self.norm_std,
            eps=self.eps,
            stats=stats,
        )
        if not len(rows.rollout):
            return None, stats
        has = rows.has_logprobs
        rollout_ids = np.asarray(cols.rollout_ids, dtype=object)[rows.rollout].tolist()
        batch = TransitionBatch.from_flat(
            prompt_ids=columnar.runs(rows.prompt, rows.prompt_start, rows.prompt_length),
            prompt_lengths=rows.prompt_length,
            response_ids=columnar.runs(rows.response, rows.response_start, rows.response_length),
            response_lengths=rows.response_length,
            logprobs=columnar.runs(rows.logprobs, rows.logprob_start[has], rows.response_length[has])
            if has.any()
            else None,
            has_logprobs=has,
            row_advantages=advantages,
            rewards=rewards,
            meta={
                "rollout_id": rollout_ids,
                "attempt_id": rows.attempt_ids,
                "group_id": rows.group_ids,
                "agent_name": rows.agents,
                "step_index": rows.step.tolist(),
                "span_id": rows.span_ids,
            },
            pad_id=pad_id,
        )
        return batch, stats


def credit_and_advantages(
    adapted: Sequence[AdaptedRollout],
    credit: Credit,
    *,
    estimator: str = "grpo",
    norm_std: bool = True,
    eps: float = 1e-6,
    stats: AdapterStats | None = None,
) -> list[Transition]:
    """Credit assignment and advantages over a batch of adapted rollouts; sets each transition's
    `reward` and `advantage` in place and returns the transitions in order.

    A rollout without a group id is a group of its own (advantage 0 under every estimator).
    Per-rollout credit modes (identity, last) feed each rollout's return `R + sum(i_t)` to the
    estimator and share the result over its transitions (`last`: only its final transition; the
    others get 0). Per-transition modes (discounted, user functions) feed every transition's reward
    to the estimator with its rollout's group, pooling the group's transitions (RLOO leaves out the
    transitions of the same rollout).
    """
    active = [a for a in adapted if a.transitions]
    groups: list[Hashable] = [("rollout", a.rollout_id) if a.group_id is None else a.group_id for a in active]
    if stats is not None:
        sizes = Counter(groups)
        stats.groups += len(sizes)
        stats.singleton_groups += sum(1 for size in sizes.values() if size == 1)
    if not active:
        return []
    # Vectorised over the batch: per-rollout values are spread over transitions with np.repeat.
    counts = np.fromiter((len(a.transitions) for a in active), dtype=np.int64, count=len(active))
    transitions = [t for a in active for t in a.transitions]
    if not credit.per_transition:  # identity, last: one return per rollout, its advantage shared
        returns = np.fromiter(
            (a.episode_reward + math.fsum(a.intermediate_rewards) for a in active), dtype=np.float64, count=len(active)
        )
        advantages = compute_advantages(estimator, returns, groups, norm_std=norm_std, eps=eps)
        rewards, values = np.repeat(returns, counts), np.repeat(advantages, counts)
        if credit.final_only:  # only each rollout's final transition gets the return and the advantage
            final = np.zeros(len(transitions), dtype=np.bool_)
            final[np.cumsum(counts) - 1] = True
            rewards, values = np.where(final, rewards, 0.0), np.where(final, values, 0.0)
    else:  # discounted, user functions: one reward per transition, groups pooled over transitions
        credited = [credit(a.episode_reward, a.intermediate_rewards, a.transitions) for a in active]
        rewards = np.fromiter(chain.from_iterable(credited), dtype=np.float64, count=len(transitions))
        group_numbers, _ = group_index(groups)
        units = np.repeat(np.arange(len(active)), counts).tolist()
        values = compute_advantages(
            estimator, rewards, np.repeat(group_numbers, counts).tolist(), units=units, norm_std=norm_std, eps=eps
        )
    for transition, reward, value in zip(transitions, rewards.tolist(), values.tolist(), strict=True):
        fields = transition.__dict__  # set without pydantic's per-assignment overhead
        fields["reward"] = reward
        fields["advantage"] = value
    return transitions
