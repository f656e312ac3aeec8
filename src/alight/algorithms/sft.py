"""Which stored transitions supervised fine-tuning learns from: pure functions over rollouts and
the transitions the adapter cut from them (`LightningRL.adapt_rollouts`).

    eligible = eligible_rollouts(rollouts, splits=["train"])      # succeeded, of the chosen splits
    transitions, _ = rl.adapt_rollouts(eligible, spans)           # agent_match, mode, truncation
    chosen, counts = select_transitions(eligible, transitions, select="best_of_group", min_reward=1.0)

`threshold` keeps every transition whose (credited) reward reaches `min_reward`; `best_of_group`
keeps, from each group (a GRPO group, or a rollout without one), the transitions of its best
rollout when that rollout's reward reaches `min_reward`: rejection-sampling fine-tuning. Then the
same prompt and response token ids are kept once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from alight.errors import ConfigError
from alight.types import Rollout, RolloutMode, RolloutStatus, Transition

#: How transitions are chosen (`algorithm.sft.select`).
SELECTIONS = ("threshold", "best_of_group")
#: Rollout modes a selection may read (`algorithm.sft.splits`).
SPLITS = tuple(mode.value for mode in RolloutMode)


@dataclass
class SelectionCounts:
    """What a selection saw and kept (reported by the fine-tuning run and the export)."""

    rollouts: int = 0  # rollouts in the store
    eligible: int = 0  # of them: succeeded, in the chosen splits
    transitions: int = 0  # transitions the adapter cut from the eligible rollouts
    selected: int = 0  # transitions kept, duplicates removed
    duplicates: int = 0  # transitions dropped as repeats of a kept one
    below_bar: int = 0  # transitions dropped by the reward bar or for not being their group's best

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def check_selection(select: str, splits: Sequence[str]) -> None:
    """ConfigError, in one line, for a selection no store can answer."""
    if select not in SELECTIONS:
        raise ConfigError(f"algorithm.sft.select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    if not splits:
        raise ConfigError("algorithm.sft.splits is empty: name train, val or dev")
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ConfigError(f"algorithm.sft.splits: unknown split {unknown[0]!r}; choose from {', '.join(SPLITS)}")


def eligible_rollouts(rollouts: Iterable[Rollout], splits: Sequence[str]) -> list[Rollout]:
    """The succeeded rollouts of the chosen splits (rollout modes: train, val, dev), in order.
    Validation rollouts are left out unless "val" is named: their tasks measure the result."""
    wanted = set(splits)
    return [r for r in rollouts if r.status == RolloutStatus.SUCCEEDED and r.mode.value in wanted]


def select_transitions(
    rollouts: Sequence[Rollout | Mapping[str, Any]],
    transitions: Sequence[Transition],
    *,
    select: str = "threshold",
    min_reward: float = 1.0,
    dedupe: bool = True,
) -> tuple[list[Transition], SelectionCounts]:
    """The transitions to learn from, in input order, and the counts (`rollouts`/`eligible` left 0:
    the caller knows them). `rollouts` give each rollout's group and reward (None counts as 0);
    ties for a group's best go to the rollout listed first."""
    check_selection(select, ["train"])
    counts = SelectionCounts(transitions=len(transitions))
    if select == "threshold":
        kept = [t for t in transitions if t.reward >= min_reward]
    else:
        best = _best_of_groups(rollouts, {t.rollout_id for t in transitions}, min_reward)
        kept = [t for t in transitions if t.rollout_id in best]
    counts.below_bar = len(transitions) - len(kept)
    if dedupe:
        kept, counts.duplicates = deduplicate(kept)
    counts.selected = len(kept)
    return kept, counts


def _best_of_groups(
    rollouts: Sequence[Rollout | Mapping[str, Any]], with_transitions: set[str], min_reward: float
) -> set[str]:
    """Ids of each group's best rollout (among those with transitions) that reaches `min_reward`."""
    best: dict[Hashable, tuple[float, str]] = {}
    for rollout in rollouts:
        if isinstance(rollout, Mapping):
            rollout_id, group_id, reward = rollout["rollout_id"], rollout.get("group_id"), rollout.get("reward")
        else:
            rollout_id, group_id, reward = rollout.rollout_id, rollout.group_id, rollout.reward
        if rollout_id not in with_transitions:
            continue
        group: Hashable = ("rollout", rollout_id) if group_id is None else group_id
        value = 0.0 if reward is None else float(reward)
        if group not in best or value > best[group][0]:
            best[group] = (value, rollout_id)
    return {rollout_id for value, rollout_id in best.values() if value >= min_reward}


def deduplicate(transitions: Sequence[Transition]) -> tuple[list[Transition], int]:
    """The transitions with repeats of the same prompt and response token ids (and response mask)
    dropped, the first kept; and how many were dropped."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for t in transitions:
        key = (_ids(t.prompt_ids), _ids(t.response_ids), None if t.response_mask is None else _ids(t.response_mask))
        if key in seen:
            continue
        seen.add(key)
        kept.append(t)
    return kept, len(transitions) - len(kept)


def _ids(ids: Any) -> tuple[int, ...]:
    return tuple(ids.tolist() if hasattr(ids, "tolist") else ids)
