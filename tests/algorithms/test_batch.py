"""TransitionBatch: verl's layout, minimal padding, masks, log-probs, advantages, slicing."""

from __future__ import annotations

import pytest
import torch

from alight.algorithms import TransitionBatch
from alight.types import Transition


def _t(prompt: list[int], response: list[int], **fields: object) -> Transition:
    return Transition(
        prompt_ids=prompt, response_ids=response, reward=fields.pop("reward", 0.0), rollout_id="r", **fields
    )  # type: ignore[arg-type]


@pytest.fixture
def batch() -> TransitionBatch:
    return TransitionBatch.from_transitions(
        [
            _t([5, 6, 7], [8, 9], advantage=0.5, response_logprobs=[-1.0, -2.0], reward=1.0, agent_name="a"),
            _t([1], [2, 3, 4, 5], response_mask=[1, 0, 0, 1], response_logprobs=[-1.0, 0.0, 0.0, -4.0], step_index=1),
            _t([1, 2], [3], advantage=-1.0, reward=2.0, span_id="s3"),
        ],
        pad_id=0,
    )


def test_layout_mirrors_verl(batch: TransitionBatch) -> None:
    t = {key: value.tolist() for key, value in batch.tensors().items()}
    assert (len(batch), batch.prompt_length, batch.response_length) == (3, 3, 4)  # padded to the batch max
    assert t["input_ids"] == [[5, 6, 7, 8, 9, 0, 0], [0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 0, 0]]
    assert t["prompts"] == [[5, 6, 7], [0, 0, 1], [0, 1, 2]]
    assert t["responses"] == [[8, 9, 0, 0], [2, 3, 4, 5], [3, 0, 0, 0]]
    assert t["attention_mask"] == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0]]
    expected_positions = (batch.attention_mask.cumsum(dim=1) - 1).clamp(min=0).tolist()  # verl's definition
    assert t["position_ids"] == expected_positions
    assert t["response_mask"] == [[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 0]]
    assert t["old_log_probs"] == [[-1.0, -2.0, 0.0, 0.0], [-1.0, 0.0, 0.0, -4.0], [0.0, 0.0, 0.0, 0.0]]
    assert t["has_old_log_probs"] == [True, True, False]
    assert t["advantages"] == [[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
    assert t["rewards"] == [1.0, 0.0, 2.0]
    assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.response_mask.dtype == torch.int64
    assert batch.old_log_probs.dtype == batch.advantages.dtype == torch.float32
    assert batch.meta["agent_name"] == ["a", None, None] and batch.meta["step_index"] == [0, 1, 0]
    assert batch.meta["span_id"] == [None, None, "s3"]


def test_split_and_select_trim_padding_and_keep_rows(batch: TransitionBatch) -> None:
    first, second = batch.split(2)
    assert (len(first), len(second)) == (2, 1)
    assert second.input_ids.tolist() == [[1, 2, 3]] and second.response_mask.tolist() == [[1]]
    assert second.position_ids.tolist() == [[0, 1, 2]] and second.meta["span_id"] == ["s3"]
    picked = batch.select([2, 0])
    assert picked.input_ids.tolist() == [[0, 1, 2, 3, 0], [5, 6, 7, 8, 9]]
    assert picked.advantages.tolist() == [[-1.0, 0.0], [0.5, 0.5]]
    assert picked.response_mask.tolist() == [[1, 0], [1, 1]]
    assert picked.meta["agent_name"] == [None, "a"]
    moved = batch.to("cpu")
    assert torch.equal(moved.input_ids, batch.input_ids) and moved.meta is batch.meta


def test_plain_transitions_need_no_stored_mask() -> None:
    batch = TransitionBatch.from_transitions([_t([1, 2], [3]), _t([4], [5, 6])], pad_id=9)
    assert batch.input_ids.tolist() == [[1, 2, 3, 9], [9, 4, 5, 6]]
    assert batch.response_mask.tolist() == [[1, 0], [1, 1]]
    assert batch.has_old_log_probs.tolist() == [False, False]


@pytest.mark.parametrize("transitions", [[], [Transition(prompt_ids=[], response_ids=[1], reward=0.0, rollout_id="r")]])
def test_empty_input_is_refused(transitions: list[Transition]) -> None:
    with pytest.raises(ValueError):
        TransitionBatch.from_transitions(transitions, pad_id=0)
