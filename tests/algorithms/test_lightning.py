"""LightningRL end to end over hand-made rollouts: credit modes x estimators, groups, configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from alight.algorithms import LightningRL, TransitionBatch
from alight.config import AdapterConfig, AlgorithmConfig, load_config, to_object
from alight.errors import ConfigError
from alight.types import Rollout, Task
from tests.adapters.factory import Trace

H = 0.5 / math.sqrt(0.5)  # GRPO advantage of rewards [1, 0] in one group


def _batch() -> tuple[list[Rollout], dict[str, list]]:  # type: ignore[type-arg]
    """ro-a (group g, 2 calls, R=1), ro-b (group g, 1 call, R=0), ro-c (no group, 1 call, R=1)."""
    spans = {}
    a = Trace("ro-a")
    a.llm([1], [10])
    a.llm([1, 10, 2], [11])
    a.reward(1.0, "final")
    b = Trace("ro-b")
    b.llm([1], [20])
    b.reward(0.0, "final")
    c = Trace("ro-c")
    c.llm([1], [30])
    c.reward(1.0, "final")
    for trace in (a, b, c):
        spans[trace.rollout_id] = trace.spans
    rollouts = [
        Rollout(rollout_id="ro-a", task=Task(input=1), group_id="g", reward=1.0),
        Rollout(rollout_id="ro-b", task=Task(input=1), group_id="g", reward=0.0),
        Rollout(rollout_id="ro-c", task=Task(input=2), reward=1.0),
    ]
    return rollouts, spans


# (credit, gamma, estimator, rewards per transition, advantages per transition) in order a0, a1, b0, c0
TABLE = [
    ("identity", 1.0, "grpo", [1, 1, 0, 1], [H, H, -H, 0]),
    ("identity", 1.0, "rloo", [1, 1, 0, 1], [1, 1, -1, 0]),
    ("identity", 1.0, "reinforce_pp", [1, 1, 0, 1], [1, 1, -1, 0]),  # centred [.5, -.5, 0] / batch std .5
    ("last", 1.0, "grpo", [0, 1, 0, 1], [0, H, -H, 0]),
    # per transition, pooled over the group: rewards [.5, 1, 0], mean .5, std .5
    ("discounted", 0.5, "grpo", [0.5, 1, 0, 1], [0, 1, -1, 0]),
    # leave-one-rollout-out: ro-a's baseline is ro-b's mean 0, ro-b's is ro-a's mean .75
    ("discounted", 0.5, "rloo", [0.5, 1, 0, 1], [0.5, 1, -0.75, 0]),
]


@pytest.mark.parametrize(("credit", "gamma", "estimator", "rewards", "advantages"), TABLE)
def test_credit_modes_and_estimators(
    credit: str, gamma: float, estimator: str, rewards: list[float], advantages: list[float]
) -> None:
    rollouts, spans = _batch()
    rl = LightningRL.from_config(AdapterConfig(credit=credit, gamma=gamma), AlgorithmConfig(advantage=estimator))
    transitions, stats = rl.adapt_rollouts(rollouts, spans)
    assert [t.response_ids[0] for t in transitions] == [10, 11, 20, 30]
    assert [t.reward for t in transitions] == pytest.approx(rewards)
    assert [t.advantage for t in transitions] == pytest.approx(advantages, abs=1e-5)
    assert (stats.rollouts, stats.transitions, stats.groups, stats.singleton_groups) == (3, 4, 2, 1)


def test_intermediate_rewards_count_in_the_rollout_return() -> None:
    rollouts, spans = _batch()
    extra = Trace("ro-b")
    extra.llm([1], [20])
    extra.reward(0.5)  # emitted mid-episode: ro-b's return becomes 0.5
    extra.reward(0.0, "final")
    spans["ro-b"] = extra.spans
    transitions, _ = LightningRL.from_config(AdapterConfig(), AlgorithmConfig(norm_std=False)).adapt_rollouts(
        rollouts, spans
    )
    assert [t.reward for t in transitions] == [1.0, 1.0, 0.5, 1.0]
    assert [t.advantage for t in transitions] == pytest.approx([0.25, 0.25, -0.25, 0.0])


def test_plain_dicts_give_the_same_transitions_and_a_batch() -> None:
    rollouts, spans = _batch()
    rl = LightningRL.from_config(AdapterConfig(agent_match="writer"), AlgorithmConfig())
    objects, _ = rl.adapt_rollouts(rollouts, spans)
    dict_rollouts = [r.model_dump(mode="json") for r in rollouts]
    dict_spans = {rid: [s.model_dump(mode="json") for s in ss] for rid, ss in spans.items()}
    dicts, _ = rl.adapt_rollouts(dict_rollouts, dict_spans)
    assert dicts == objects
    batch = rl.batch(dicts, pad_id=0)
    assert isinstance(batch, TransitionBatch) and len(batch) == 4
    assert batch.advantages[:, 0].tolist() == pytest.approx([H, H, -H, 0.0], abs=1e-5)
    assert batch.meta["rollout_id"] == ["ro-a", "ro-a", "ro-b", "ro-c"]


def test_rollouts_without_spans_or_kept_calls_do_not_join_their_group() -> None:
    rollouts, spans = _batch()
    rollouts.append(Rollout(rollout_id="ro-d", task=Task(input=1), group_id="g", reward=0.0))
    transitions, stats = LightningRL.from_config().adapt_rollouts(rollouts, spans)
    assert [t.advantage for t in transitions] == pytest.approx([H, H, -H, 0], abs=1e-5)
    assert stats.rollouts_without_transitions == 1


@pytest.mark.parametrize(
    ("adapter", "algorithm", "message"),
    [
        (AdapterConfig(), AlgorithmConfig(advantage="ppo"), "advantage must be one of"),
        (AdapterConfig(), AlgorithmConfig(eps=0.0), "eps must be positive"),
        (AdapterConfig(mode="tree"), AlgorithmConfig(), "adapter mode must be one of"),
        (AdapterConfig(air=[{"bogus": 1}]), AlgorithmConfig(), "unknown keys"),
        (AdapterConfig(credit="nope"), AlgorithmConfig(), "credit must be one of"),
    ],
)
def test_bad_configs_are_config_errors(adapter: AdapterConfig, algorithm: AlgorithmConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LightningRL.from_config(adapter, algorithm)


def test_the_experiment_yaml_fills_adapter_and_algorithm(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        "agent: {entrypoint: 'pkg.mod:agent'}\n"
        "adapter:\n"
        "  agent_match: write|rewrite\n"
        "  mode: trajectory\n"
        "  credit: discounted\n"
        "  gamma: 0.9\n"
        "  max_prompt_length: 512\n"
        "  air:\n"
        "    - {match: {kind: tool, name: run_sql}, on_error: -0.2, sql_fails: -0.5}\n"
        "algorithm: {advantage: rloo, norm_std: false}\n"
    )
    cfg = to_object(load_config(config, ["adapter.max_response_length=128"]))
    assert cfg.adapter.agent_match == "write|rewrite" and cfg.adapter.max_response_length == 128
    assert cfg.adapter.air == [{"match": {"kind": "tool", "name": "run_sql"}, "on_error": -0.2, "sql_fails": -0.5}]
    rl = LightningRL.from_config(cfg.adapter, cfg.algorithm)
    assert (rl.adapter.mode, rl.credit.name, rl.credit.gamma, rl.advantage, rl.norm_std) == (
        "trajectory",
        "discounted",
        0.9,
        "rloo",
        False,
    )
