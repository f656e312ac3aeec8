"""A colocated backend (the verl case on one GPU) gets the engine's memory for its update: the loop
holds the proxy's calls, puts the engine to sleep, updates, wakes the engine, then serves the new
weights. Run through the real stack with the embedded backend flagged colocated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.test_fit_calc import REPO, short_config


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_engine_sleeps_around_each_update_of_a_colocated_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.backends import factory
    from alight.backends.embedded import EmbeddedBackend
    from alight.engines.embedded import EmbeddedEngine
    from alight.trainer import Trainer

    events: list[str] = []

    class ColocatedEmbedded(EmbeddedBackend):
        colocated = True

        def update(self, batch: Any) -> dict[str, float]:
            events.append("update")
            return super().update(batch)

        def engine_weights(self) -> Any:
            events.append("engine_weights")
            return super().engine_weights()

    async def sleep(self: EmbeddedEngine) -> None:
        events.append("sleep")

    async def wake_up(self: EmbeddedEngine) -> None:
        events.append("wake_up")

    original_update_weights = EmbeddedEngine.update_weights

    async def update_weights(self: EmbeddedEngine, weights: Any, version: int) -> None:
        events.append(f"serve {version}")
        await original_update_weights(self, weights, version)

    real_class = factory.backend_class
    monkeypatch.setattr(
        factory, "backend_class", lambda name: ColocatedEmbedded if name == "embedded" else real_class(name)
    )
    monkeypatch.setattr(EmbeddedEngine, "sleep", sleep)
    monkeypatch.setattr(EmbeddedEngine, "wake_up", wake_up)
    monkeypatch.setattr(EmbeddedEngine, "update_weights", update_weights)
    monkeypatch.chdir(REPO)
    cfg = short_config(tmp_path, "warm_start.steps=0", "trainer.val_every=0", "trainer.save_every=0")
    result = Trainer(cfg).fit()

    assert result.steps == 2
    one_step = ["sleep", "update", "wake_up", "engine_weights"]
    # the last engine_weights is the final checkpoint's (EmbeddedBackend.save writes the served weights)
    assert events == [*one_step, "serve 1", *one_step, "serve 2", "engine_weights"]
