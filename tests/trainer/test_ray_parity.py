"""`runner.backend=ray` trains as the local pool does: the shortened calc training, same seed,
once with local worker processes and once with Ray actors on a local Ray cluster the pool starts
itself, repeats every validation reward step for step (and every other metric, as two local runs
do: tests/trainer/test_seeded_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.test_fit_calc import REPO, short_config
from tests.trainer.test_seeded_runs import differences


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_ray_pool_learns_as_the_local_pool_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    from alight.runner.ray_pool import RayRunnerPool
    from alight.trainer import Trainer

    started: list[RayRunnerPool] = []
    real_start = RayRunnerPool.start

    def start(pool: RayRunnerPool) -> RayRunnerPool:  # the real start, noted: the run did use Ray
        started.append(pool)
        return real_start(pool)

    monkeypatch.setattr(RayRunnerPool, "start", start)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no auth token written under the home folder
    local = Trainer(short_config(tmp_path / "local")).fit()
    on_ray = Trainer(short_config(tmp_path / "ray", "runner.backend=ray", "runner.ray.local_cpus=2")).fit()

    assert len(started) == 1 and started[0].stats().attempts_succeeded > 0

    val = [m.get("val/reward_mean") for m in local.metrics]
    assert [m.get("val/reward_mean") for m in on_ray.metrics] == val
    assert len(val) == 3 and None not in val  # validated at steps 0, 1, 2
    assert differences(local.metrics, on_ray.metrics) == []
