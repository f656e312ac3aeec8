"""Per-agent LoRA through the real stack: SQLite store server, proxy + embedded engine serving one
adapter per agent, runner processes running a two-agent workflow (writer, then rewriter, each in
its `agent_scope`), the LightningRL adapter reading the stored spans, the per-agent backend.

An update from the writer's transitions only leaves the rewriter's adapter bit for bit unchanged
(and the reverse); once the adapters differ, every recorded call names the adapter that answered
and its token log-probs are those of a plain forward pass of the base with that agent's adapter
merged in by hand (and not those of the other agent's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from alight.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    EngineConfig,
    ExperimentConfig,
    LoraConfig,
    RunnerConfig,
    SamplingConfig,
)
from tests.backends.test_per_agent_lora import hand_merged_log_probs, same

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

AGENTS = ["writer", "rewriter"]
TASKS = [{"question": "Tom has 12 pens."}, {"question": "Ana reads 40 pages."}]


def config(tiny_dir: Path) -> ExperimentConfig:
    # The entropy bonus gives every row a gradient even when a group's rewards tie (advantage 0).
    algorithm = AlgorithmConfig(lr=1e-2, entropy_coef=0.05, lora=LoraConfig(per_agent=True, agents=AGENTS))
    return ExperimentConfig(
        agent=AgentConfig(entrypoint="tests.fixtures.two_agents:write_then_rewrite"),
        engine=EngineConfig(model=str(tiny_dir), sampling=SamplingConfig(temperature=1.0, max_tokens=6)),
        runner=RunnerConfig(n_runners=2, timeout_s=60),
        algorithm=algorithm,
    )


@pytest.mark.timeout(240)
def test_each_agent_is_trained_and_answered_by_its_own_adapter(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    from alight import semconv
    from alight.algorithms.lightning import LightningRL
    from alight.backends.factory import make_backend
    from alight.backends.per_agent_lora import PerAgentLoraBackend
    from alight.trainer.events import Watchers
    from alight.trainer.rollouts import StepRollouts
    from alight.trainer.stack import LocalStack
    from alight.types import SpanKind

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # runners import tests.fixtures from here
    cfg = config(tiny_dir)
    backend = make_backend(cfg, tiny_dir)
    assert isinstance(backend, PerAgentLoraBackend)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    rl = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=tokenizer)

    async def run_rollouts(rollouts: StepRollouts, step: int) -> list[str]:
        ids = await rollouts.enqueue(step, "train", TASKS, [0, 1], 2)
        ended = await rollouts.wait(step, ids, 120, 1.0)
        await rollouts.flush()
        assert [r.status.value for r in ended] == ["succeeded"] * 4
        return ids

    async def scenario(stack: LocalStack) -> None:
        store = stack.trainer_store()
        try:
            rollouts = StepRollouts(store, stack, cfg, Watchers())
            ids = await run_rollouts(rollouts, 1)
            batch, _ = await rl.batch_from_store(store, ids, tokenizer.pad_token_id or 0)
            assert batch is not None
            agents = batch.meta["agent_name"]
            assert sorted(agents) == sorted(AGENTS * 4)  # one call per agent per rollout
            for version, (trained, other) in enumerate((("writer", "rewriter"), ("rewriter", "writer")), 1):
                before = {a: backend.adapter_tensors(a) for a in AGENTS}
                rows = [i for i, agent in enumerate(agents) if agent == trained]
                metrics = backend.update(batch.select(rows))
                assert same(before[other], backend.adapter_tensors(other))  # bit for bit
                assert not same(before[trained], backend.adapter_tensors(trained))
                assert metrics[f"actor/{trained}/rows"] == 4 and f"actor/{other}/rows" not in metrics
                await rollouts.serve(backend.engine_weights(), version)

            ids = await run_rollouts(rollouts, 3)
            spans = await store.span_dicts(ids)
            calls = [s for rows in spans.values() for s in rows if s["kind"] == SpanKind.LLM.value]
            assert len(calls) == 8
            weights = {a: backend.adapter_tensors(a) for a in AGENTS}
            for call in calls:
                attributes = call["attributes"]
                agent = attributes[semconv.AGENT_NAME]
                assert attributes[semconv.LLM_ADAPTER] == agent and attributes[semconv.RESOURCES_VERSION] == 2
                recorded = Recorded(attributes)
                expected = hand_merged_log_probs(tiny_dir, weights[agent], agent, recorded)
                assert torch.allclose(torch.tensor(recorded.response_logprobs), expected, atol=1e-4)
                other = "writer" if agent == "rewriter" else "rewriter"
                wrong = hand_merged_log_probs(tiny_dir, weights[other], other, recorded)
                assert (wrong - expected).abs().max() > 1e-3
        finally:
            await store.close()

    try:
        with LocalStack(cfg, tmp_path / "run") as stack:
            asyncio.run(scenario(stack))
    finally:
        backend.close()


class Recorded:
    """A stored LLM span's token ids and log-probs, as the engine's `Generation` names them."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        from alight import semconv

        self.prompt_token_ids = list(attributes[semconv.LLM_PROMPT_TOKEN_IDS])
        self.response_token_ids = list(attributes[semconv.LLM_RESPONSE_TOKEN_IDS])
        self.response_logprobs = list(attributes[semconv.LLM_RESPONSE_LOGPROBS])
