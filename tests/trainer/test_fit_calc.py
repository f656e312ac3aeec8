"""A shortened calc training through the real stack: SQLite store server, LLM proxy with the
embedded engine, runner processes running the recipe's openai-client agent, LightningRL adapter,
embedded PyTorch backend. Checks what each step recorded, not how fast it ran."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from alight.config import load_config, to_object

REPO = Path(__file__).resolve().parents[2]
CALC = REPO / "configs" / "calc.yaml"

#: A few steps of everything: a short warm start, 2 GRPO steps of 2 tasks x 4 rollouts, validation
#: on 4 tasks. The entropy bonus makes every update move the weights even when all the rewards of
#: an untrained model's group are equal (GRPO advantages 0): the test checks the update path runs,
#: the recipe's README figures check that it learns.
SHORT = [
    "warm_start.steps=20",
    "warm_start.size=200",
    "warm_start.batch_size=8",
    "trainer.steps=2",
    "trainer.batch_size=2",
    "trainer.group_size=4",
    "trainer.val_every=1",
    "trainer.save_every=1",
    "trainer.keep_checkpoints=5",
    "data.val_size=4",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=48",
    "algorithm.entropy_coef=0.01",
    "logging.dashboard=false",
]


def short_config(tmp_path: Path, *extra: str) -> Any:
    return to_object(load_config(CALC, [*SHORT, f"trainer.output_dir={tmp_path / 'runs'}", *extra]))


class Recorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.stages: list[str] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        self.steps.append(metrics)

    def on_stage(self, stage: str, done: int, total: int, info: dict[str, Any]) -> None:
        self.stages.append(stage)


def weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_calc_training_runs_every_part_for_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from alight import semconv
    from alight.backends.embedded import EmbeddedBackend
    from alight.store.sqlite import SqliteStore
    from alight.trainer import Trainer
    from alight.trainer.threads import usable_cpus
    from alight.types import RolloutMode, SpanKind

    threads: dict[str, list[int]] = {"update": [], "warm_start": []}
    for name in threads:  # the torch threads each ran with (a sync run on CPU: every usable core)
        original = getattr(EmbeddedBackend, name)

        def counted(self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            threads[_name].append(torch.get_num_threads())
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(EmbeddedBackend, name, counted)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (tests/conftest.py sets it for the suite)
    monkeypatch.chdir(REPO)
    recorder = Recorder()
    result = Trainer(short_config(tmp_path), watchers=[recorder]).fit()

    assert result.steps == 2 and not result.stopped
    assert threads == {"update": [usable_cpus()] * 2, "warm_start": [usable_cpus()]}
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2] == [m["step"] for m in recorder.steps]
    assert "warm start" in recorder.stages and "warm_start/loss" in lines[0]
    for m in lines:
        assert 0.0 <= m["val/reward_mean"] <= 1.0
    for m in lines[1:]:  # every RL step recorded rewards, trained and served new weights
        assert 0.0 <= m["train/reward_mean"] <= 1.0
        assert m["rollouts/succeeded"] == 8 and m["transitions"] >= 8
        assert m["weights_version"] == m["step"]
        assert m["timing/rollout_s"] > 0 and m["timing/update_s"] > 0
    assert result.png is not None and result.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The weights changed: the step-2 checkpoint differs from the warm-started step 0.
    checkpoints = result.run_dir / "checkpoints"
    before, after = weights(checkpoints / "step_000000"), weights(checkpoints / "step_000002")
    assert any(not before[k].equal(after[k]) for k in before)

    async def check_store() -> None:
        store = SqliteStore(result.run_dir / "store.db")
        try:
            train = await store.list_rollouts(mode=RolloutMode.TRAIN)
            assert len(train) == 2 * 2 * 4
            assert all(r.reward is not None for r in train)
            by_step = {s: [r for r in train if r.metadata["step"] == s] for s in (1, 2)}
            # The served model's version advanced: step 2's calls were answered by the step-1 weights.
            for step, rollouts in by_step.items():
                spans = await store.span_dicts([r.rollout_id for r in rollouts])
                llm = [s for rows in spans.values() for s in rows if s["kind"] == SpanKind.LLM.value]
                assert llm and {s["attributes"][semconv.RESOURCES_VERSION] for s in llm} == {step - 1}
            resources = await store.get_latest_resources()
            assert resources is not None and resources.version == 1 + 2  # published at start, then per step
        finally:
            await store.close()

    asyncio.run(check_store())
