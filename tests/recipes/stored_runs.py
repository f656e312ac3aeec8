"""What a finished training run of a recipe stored: the spans of its training rollouts, as the
embedded engine and the real runner pool recorded them, and what the adapter selects from them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight import semconv
from alight.config.schema import ExperimentConfig
from alight.types import Rollout, Span, SpanKind


@dataclass
class StoredRun:
    rollouts: list[Rollout]
    spans: dict[str, list[Span]]

    def llm_agents(self) -> Counter[str]:
        """How many LLM calls each agent made, over every training rollout."""
        return Counter(
            str(s.attributes.get(semconv.AGENT_NAME))
            for spans in self.spans.values()
            for s in spans
            if s.kind == SpanKind.LLM
        )

    def tools(self) -> Counter[str]:
        return Counter(s.name for spans in self.spans.values() for s in spans if s.kind == SpanKind.TOOL)

    def token_id_sources(self) -> set[Any]:
        return {
            s.attributes.get(semconv.LLM_TOKEN_IDS_SOURCE)
            for spans in self.spans.values()
            for s in spans
            if s.kind == SpanKind.LLM
        }


def stored_run(run_dir: Path) -> StoredRun:
    """The training rollouts of the run in `run_dir` and each one's spans (its last attempt)."""
    from alight.store.sqlite import SqliteStore
    from alight.types import RolloutMode

    async def read() -> StoredRun:
        store = SqliteStore(run_dir / "store.db")
        try:
            rollouts = await store.list_rollouts(mode=RolloutMode.TRAIN)
            return StoredRun(rollouts, {r.rollout_id: await store.query_spans(r.rollout_id) for r in rollouts})
        finally:
            await store.close()

    return asyncio.run(read())


def selected_agents(run: StoredRun, cfg: ExperimentConfig, tokenizer: Any, mode: str) -> Counter[str]:
    """The agent of each transition the config's adapter (in `mode`) makes from the run's spans."""
    from alight.algorithms import LightningRL

    adapter_cfg = dataclasses.replace(cfg.adapter, mode=mode)
    pipeline = LightningRL.from_config(adapter_cfg, cfg.algorithm, tokenizer=tokenizer)
    agents: Counter[str] = Counter()
    for rollout in run.rollouts:
        adapted = pipeline.adapter.adapt(
            run.spans[rollout.rollout_id], rollout_id=rollout.rollout_id, reward=rollout.reward
        )
        agents.update(str(t.agent_name) for t in adapted.transitions)
    return agents
