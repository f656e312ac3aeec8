"""What fine-tuning from a stored run learns from: small hand tables for the selection rules
(threshold, best of group, deduplication, splits) and, through a real memory store and the real
adapter, agent matching and the counts."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from alight.algorithms.sft import deduplicate, eligible_rollouts, select_transitions
from alight.config.schema import AdapterConfig, AlgorithmConfig, SftConfig
from alight.errors import ConfigError
from alight.types import Rollout, RolloutMode, RolloutStatus, Task, Transition
from tests.adapters.factory import Trace


def rollout(rid: str, reward: float | None, group: str | None = None, **fields: Any) -> Rollout:
    return Rollout(rollout_id=rid, task=Task(input=rid), group_id=group, reward=reward, **fields)


def transition(rid: str, prompt: list[int], response: list[int], reward: float) -> Transition:
    return Transition(prompt_ids=prompt, response_ids=response, reward=reward, rollout_id=rid)


def ids(transitions: list[Transition]) -> list[tuple[str, list[int]]]:
    return [(t.rollout_id, list(t.response_ids)) for t in transitions]


# rollout: (group, reward); each has the transitions listed below (response ids mark them).
ROLLOUTS = [
    rollout("a1", 1.0, "g1"),
    rollout("a2", 0.0, "g1"),
    rollout("b1", 0.5, "g2"),
    rollout("b2", 0.8, "g2"),  # g2's best, under a bar of 1 but over 0.7
    rollout("c1", 1.0, "g3"),
    rollout("c2", 1.0, "g3"),  # a tie: the first listed (c1) is the best
    rollout("d1", 1.0, None),  # no group: a group of its own
    rollout("e1", 2.0, "g4"),  # g4's best by reward, but it has no transition (agent not matched)
    rollout("e2", 1.0, "g4"),
]
TRANSITIONS = [
    transition("a1", [1], [11], 1.0),
    transition("a1", [1, 11, 2], [12], 1.0),
    transition("a2", [1], [13], 0.0),
    transition("b1", [3], [31], 0.5),
    transition("b2", [3], [32], 0.8),
    transition("c1", [4], [41], 1.0),
    transition("c2", [5], [51], 1.0),
    transition("d1", [6], [61], 1.0),
    transition("e2", [7], [71], 1.0),
]


@pytest.mark.parametrize(
    ("select", "bar", "expected"),
    [
        ("threshold", 1.0, ["a1:11", "a1:12", "c1:41", "c2:51", "d1:61", "e2:71"]),
        ("threshold", 0.7, ["a1:11", "a1:12", "b2:32", "c1:41", "c2:51", "d1:61", "e2:71"]),
        ("threshold", 5.0, []),
        ("best_of_group", 1.0, ["a1:11", "a1:12", "c1:41", "d1:61", "e2:71"]),
        ("best_of_group", 0.7, ["a1:11", "a1:12", "b2:32", "c1:41", "d1:61", "e2:71"]),
        ("best_of_group", 0.0, ["a1:11", "a1:12", "b2:32", "c1:41", "d1:61", "e2:71"]),
    ],
)
def test_threshold_and_best_of_group_keep_the_table_rows(select: str, bar: float, expected: list[str]) -> None:
    kept, counts = select_transitions(ROLLOUTS, TRANSITIONS, select=select, min_reward=bar)
    assert [f"{rid}:{resp[0]}" for rid, resp in ids(kept)] == expected
    assert counts.transitions == 9 and counts.selected == len(expected) == 9 - counts.below_bar


def test_best_of_group_reads_rollout_dicts_too() -> None:
    dicts = [{"rollout_id": r.rollout_id, "group_id": r.group_id, "reward": r.reward} for r in ROLLOUTS]
    assert ids(select_transitions(dicts, TRANSITIONS, select="best_of_group")[0]) == ids(
        select_transitions(ROLLOUTS, TRANSITIONS, select="best_of_group")[0]
    )


def test_a_rollout_without_reward_counts_as_zero_in_its_group() -> None:
    rollouts = [rollout("x1", None, "g"), rollout("x2", 0.1, "g")]
    table = [transition("x1", [1], [1], 0.0), transition("x2", [1], [2], 0.1)]
    assert ids(select_transitions(rollouts, table, select="best_of_group", min_reward=0.0)[0]) == [("x2", [2])]


def test_duplicates_of_prompt_and_response_ids_are_kept_once() -> None:
    table = [
        transition("r1", [1, 2], [3], 1.0),
        transition("r2", [1, 2], [3], 1.0),  # same ids, another rollout: a duplicate
        transition("r3", [1, 2], [4], 1.0),  # another response
        transition("r4", [1], [2, 3], 1.0),  # the same tokens cut elsewhere: not a duplicate
    ]
    arrays = Transition.unchecked(np.array([1, 2]), np.array([3]), 1.0, "r5")  # the store's bulk read: arrays
    kept, dropped = deduplicate([*table, arrays])
    assert [t.rollout_id for t in kept] == ["r1", "r3", "r4"] and dropped == 2
    masked = Transition(prompt_ids=[1, 2], response_ids=[3], reward=1.0, rollout_id="r6", response_mask=[0])
    assert deduplicate([table[0], masked])[1] == 0  # another mask trains other tokens
    kept, counts = select_transitions([], [*table, arrays], dedupe=False)
    assert len(kept) == 5 and counts.duplicates == 0
    kept, counts = select_transitions([], [*table, arrays])
    assert (counts.selected, counts.duplicates) == (3, 2)


def test_only_succeeded_rollouts_of_the_chosen_splits_are_eligible() -> None:
    rollouts = [
        rollout("t-ok", 1.0, status=RolloutStatus.SUCCEEDED, mode=RolloutMode.TRAIN),
        rollout("t-failed", None, status=RolloutStatus.FAILED, mode=RolloutMode.TRAIN),
        rollout("t-running", None, status=RolloutStatus.RUNNING, mode=RolloutMode.TRAIN),
        rollout("v-ok", 1.0, status=RolloutStatus.SUCCEEDED, mode=RolloutMode.VAL),
        rollout("d-ok", 1.0, status=RolloutStatus.SUCCEEDED, mode=RolloutMode.DEV),
    ]
    assert [r.rollout_id for r in eligible_rollouts(rollouts, SftConfig().splits)] == ["t-ok"]
    assert [r.rollout_id for r in eligible_rollouts(rollouts, ["val", "dev"])] == ["v-ok", "d-ok"]


@pytest.mark.parametrize(
    ("sft", "named"),
    [
        (SftConfig(select="best"), "algorithm.sft.select"),
        (SftConfig(splits=[]), "algorithm.sft.splits"),
        (SftConfig(splits=["test"]), "'test'"),
    ],
)
def test_bad_selection_settings_fail_in_one_line(sft: SftConfig, named: str) -> None:
    from alight.algorithms.sft import check_selection

    with pytest.raises(ConfigError, match=named) as err:
        check_selection(sft.select, sft.splits)  # once, with the run's config (alight.trainer.checks)
    assert "\n" not in str(err.value)


def test_the_store_selection_adapts_with_agent_match_and_counts_everything() -> None:
    """Two agents' calls in each rollout; `agent_match` keeps the writer's; validation rollouts,
    failed ones and low rewards stay out; a repeated call is one transition."""
    from alight.store.memory import MemoryStore
    from alight.trainer.sft_source import select_from_store
    from alight.types import AttemptStatus

    async def main() -> tuple[Any, Any]:
        store = MemoryStore()
        plan = [  # rollout id, mode, reward (None: failed), writer's response
            ("r1", RolloutMode.TRAIN, 1.0, [21]),
            ("r2", RolloutMode.TRAIN, 1.0, [21]),  # the same call as r1: a duplicate
            ("r3", RolloutMode.TRAIN, 0.0, [23]),
            ("r4", RolloutMode.TRAIN, None, [24]),
            ("r5", RolloutMode.VAL, 1.0, [25]),
        ]
        await store.enqueue([Rollout(rollout_id=rid, task=Task(input=rid), mode=mode) for rid, mode, _, _ in plan])
        for rid, _, reward, response in plan:
            claim = await store.dequeue()
            assert claim is not None and claim.rollout.rollout_id == rid
            trace = Trace(rid, claim.attempt.attempt_id)
            trace.llm([1, 2], response, agent="writer", messages=[{"role": "user", "content": rid}])
            trace.llm([1, 2, 3], [99], agent="critic")
            await store.add_spans(trace.spans)
            status = AttemptStatus.SUCCEEDED if reward is not None else AttemptStatus.FAILED
            await store.finish_attempt(claim.attempt.attempt_id, status, reward=reward)
        writer = await select_from_store(store, AdapterConfig(agent_match="writer"), AlgorithmConfig(name="sft"))
        both = await select_from_store(store, AdapterConfig(), AlgorithmConfig(name="sft"))
        return writer, both

    writer, both = asyncio.run(main())
    assert [(t.rollout_id, list(t.response_ids), t.agent_name) for t in writer.transitions] == [("r1", [21], "writer")]
    assert writer.counts.as_dict() == {
        "rollouts": 5,
        "eligible": 3,  # r1, r2, r3: succeeded train rollouts
        "transitions": 3,
        "selected": 1,
        "duplicates": 1,
        "below_bar": 1,
    }
    assert set(writer.spans) == {writer.transitions[0].span_id}  # the export reads the call's messages
    assert [(t.rollout_id, t.agent_name) for t in both.transitions] == [("r1", "writer"), ("r1", "critic")]
    assert both.counts.duplicates == 2
