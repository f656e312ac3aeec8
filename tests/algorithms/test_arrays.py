"""Token ids as numpy arrays (the SQLite bulk read's `arrays=True`) give the same transitions,
advantages and batch as lists, in both adapter modes and with truncation."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from alight import semconv
from alight.algorithms import LightningRL
from alight.commands.trace import transition_row
from alight.config import AdapterConfig, AlgorithmConfig
from alight.types import Transition
from tests.adapters.factory import Trace

ARRAY_KEYS = {
    semconv.LLM_PROMPT_TOKEN_IDS: np.int32,
    semconv.LLM_RESPONSE_TOKEN_IDS: np.int32,
    semconv.LLM_RESPONSE_LOGPROBS: np.float64,
}


def _rollouts() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Two groups; multi-turn agents whose prompts extend their history, a rewritten context, a
    call without log-probs, a mid-episode reward."""
    spans, rollouts = {}, []
    for i in range(6):
        t = Trace(f"ro-{i}")
        t.agent("agent")
        t.llm([1, 2, 3 + i], [10, 11], logprobs=[-0.1, -0.2])
        t.llm([5, 6], [20], agent="checker")
        t.llm([1, 2, 3 + i, 10, 11, 7, 8], [12, 13, 14])  # writer continues
        t.reward(0.25 * i)
        t.llm([9], [21, 22], agent="checker", logprobs=None if i == 2 else True)  # checker rewrote its context
        t.llm([1, 2, 3 + i, 10, 11, 7, 8, 12, 13, 14, 9], [15])
        t.reward(float(i % 2), "final")
        spans[t.rollout_id] = t.dicts()
        rollouts.append({"rollout_id": t.rollout_id, "group_id": f"g{i // 3}", "reward": None})
    return rollouts, spans


def _as_arrays(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for span in spans:
        attributes = dict(span["attributes"])
        for key, dtype in ARRAY_KEYS.items():
            if isinstance(attributes.get(key), list):
                attributes[key] = np.array(attributes[key], dtype=dtype)
                attributes[key].flags.writeable = False  # as the store hands them: read-only
        out.append({**span, "attributes": attributes})
    return out


@pytest.mark.parametrize("mode", ["transition", "trajectory"])
@pytest.mark.parametrize("credit", ["identity", "last", "discounted"])
@pytest.mark.parametrize("limits", [(None, None), (4, 2)])
def test_arrays_and_lists_give_the_same_transitions_and_batch(
    mode: str, credit: str, limits: tuple[int | None, int | None]
) -> None:
    rl = LightningRL.from_config(
        AdapterConfig(mode=mode, credit=credit, max_prompt_length=limits[0], max_response_length=limits[1]),
        AlgorithmConfig(advantage="grpo"),
    )
    rollouts, spans = _rollouts()
    with_lists, stats_lists = rl.adapt_rollouts(rollouts, spans)
    with_arrays, stats_arrays = rl.adapt_rollouts(rollouts, {rid: _as_arrays(s) for rid, s in spans.items()})
    assert stats_arrays == stats_lists
    assert any(isinstance(t.prompt_ids, np.ndarray) for t in with_arrays)
    assert [t.model_dump() for t in with_arrays] == [t.model_dump() for t in with_lists]
    assert [Transition.model_validate_json(t.model_dump_json()) for t in with_arrays] == with_lists
    batch_lists, batch_arrays = rl.batch(with_lists, pad_id=0), rl.batch(with_arrays, pad_id=0)
    for name, tensor in batch_lists.tensors().items():
        assert torch.equal(batch_arrays.tensors()[name], tensor), name
    assert batch_arrays.meta == batch_lists.meta


def test_trajectory_mode_merges_array_ids_into_masked_arrays() -> None:
    rl = LightningRL.from_config(AdapterConfig(mode="trajectory"), AlgorithmConfig())
    rollouts, spans = _rollouts()
    transitions, stats = rl.adapt_rollouts(rollouts[:1], {"ro-0": _as_arrays(spans["ro-0"])})
    writer = transitions[0]
    assert isinstance(writer.response_ids, np.ndarray) and isinstance(writer.response_mask, np.ndarray)
    assert writer.response_ids.tolist() == [10, 11, 7, 8, 12, 13, 14, 9, 15]
    assert writer.response_mask.tolist() == [1, 1, 0, 0, 1, 1, 1, 0, 1]
    assert writer.response_logprobs is not None
    assert writer.response_logprobs.tolist() == [-0.1, -0.2, 0.0, 0.0, -0.5, -0.5, -0.5, 0.0, -0.5]
    assert stats.trajectory_merges == 2 and stats.trajectory_fallbacks == 1


def test_a_transition_with_arrays_shows_as_json() -> None:
    rl = LightningRL.from_config(AdapterConfig(mode="trajectory"), AlgorithmConfig())
    rollouts, spans = _rollouts()
    transitions, _ = rl.adapt_rollouts(rollouts[:1], {"ro-0": _as_arrays(spans["ro-0"])})
    row = json.loads(json.dumps(transition_row(transitions[0])))
    assert row["prompt_ids"] == [1, 2, 3] and row["trained_tokens"] == 6
    assert json.loads(transitions[0].model_dump_json())["response_mask"] == [1, 1, 0, 0, 1, 1, 1, 0, 1]
