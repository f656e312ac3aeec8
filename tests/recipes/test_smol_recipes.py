"""The paper's three agents on the real model: each SmolLM2 config (configs/calc_autogen_smol.yaml,
spider_smol.yaml, rag_smol.yaml) trains for one step through the whole stack, shortened: a one-step
warm start on the recipe's own demonstrations rendered by SmolLM2's tokenizer, one GRPO step of one
task x 2 rollouts through the agent's framework (AutoGen, LangGraph, the OpenAI Agents SDK) and the
proxy, and an update that moves the weights. What the configs reach in full is measured by their
runs in benchmarks/results/ (docs/recipes.md), not here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from alight.config import load_config, to_object
from tests.fixtures.smol import needs_smol
from tests.trainer.test_fit_calc import weights

REPO = Path(__file__).resolve().parents[2]

#: One step of everything, as small as the stack allows. The entropy bonus moves the weights even when
#: both rollouts of the group earn the same reward (GRPO advantages 0).
ONE_STEP = [
    "warm_start.steps=1",
    "warm_start.size=4",
    "warm_start.batch_size=2",
    "warm_start.warmup_steps=0",
    "trainer.steps=1",
    "trainer.batch_size=1",
    "trainer.group_size=2",
    "trainer.val_every=0",
    "trainer.save_every=1",
    "data.val_size=1",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=32",
    "engine.max_batch_size=4",
    "algorithm.entropy_coef=0.01",
    "logging.dashboard=false",
]

#: config -> the LLM calls each rollout makes that are not trained (spider's checker: agent_match
#: keeps write_query|rewrite_query; with max_turns 2 the checker runs once in every rollout).
RECIPES = {"calc_autogen_smol": 0, "spider_smol": 1, "rag_smol": 0}


@needs_smol
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_smol_config_trains_one_step(
    name: str, smol_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.store.sqlite import SqliteStore
    from alight.trainer import Trainer
    from alight.types import RolloutMode, SpanKind

    monkeypatch.chdir(REPO)
    config = load_config(
        REPO / "configs" / f"{name}.yaml",
        [*ONE_STEP, f"engine.model={smol_dir}", f"trainer.output_dir={tmp_path / 'runs'}"],
    )
    result = Trainer(to_object(config)).fit()

    assert result.steps == 1 and not result.stopped
    step0, step1 = (json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines())
    assert "warm_start/loss" in step0 and 0.0 <= step0["val/reward_mean"] <= 1.0
    assert step1["rollouts/succeeded"] == 2 and step1["weights_version"] == 1
    assert step1["actor/optimizer_steps"] >= 1
    checkpoints = result.run_dir / "checkpoints"
    before, after = weights(checkpoints / "step_000000"), weights(checkpoints / "step_000001")
    assert any(not before[k].equal(after[k]) for k in before)  # the update reached the weights

    async def llm_calls() -> int:
        store = SqliteStore(result.run_dir / "store.db")
        try:
            train = await store.list_rollouts(mode=RolloutMode.TRAIN)
            spans = await store.span_dicts([r.rollout_id for r in train])
            return sum(s["kind"] == SpanKind.LLM.value for rows in spans.values() for s in rows)
        finally:
            await store.close()

    # Every call of the trained agents became a transition, and only theirs (agent_match).
    calls, untrained = asyncio.run(llm_calls()), RECIPES[name] * 2
    assert 2 <= step1["transitions"] <= calls - untrained
    if not untrained:
        assert step1["transitions"] == calls
