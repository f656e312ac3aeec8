"""`trainer.backend: verl` end to end on CPU: the real loop (store, proxy, embedded engine, runners,
the calc agent) with verl's FSDP workers on Ray updating the policy (`verl.trainer.device: cpu`),
the embedded engine serving the weights verl's actor exports after each step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.trainer.test_fit_calc import REPO, short_config

pytest.importorskip("verl")
pytest.importorskip("ray")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_calc_steps_with_verls_workers_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    from alight.trainer import Trainer

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(REPO)
    cfg = short_config(
        tmp_path,
        "trainer.backend=verl",
        "+verl.trainer.device=cpu",
        "warm_start.steps=0",  # the verl backend trains pretrained models: no warm start
        "trainer.val_every=0",
        "trainer.save_every=2",
    )
    result = Trainer(cfg).fit()
    assert result.steps == 2
    run = next((tmp_path / "runs").iterdir())
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "actor/loss" in s]
    assert [s["weights_version"] for s in trained] == [1, 2]  # the engine served each export
    assert all("actor/entropy" in s and s["timing/update_s"] > 0 for s in trained)
    # the embedded engine serves verl's export (fp32 both): its recorded log-probs are the actor's
    assert all(s["actor/logprob_gap_mean"] < 1e-3 and s["actor/logprob_gap_max"] < 1e-2 for s in trained), trained
    served = load_file(str(run / "backend" / "policy" / "model.safetensors"))  # what verl's actor exported
    (checkpoint,) = [p for p in (run / "checkpoints").iterdir() if p.is_dir()]
    assert json.loads((checkpoint / "verl" / "state.json").read_text()) == {"steps": 2}
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert served.keys() == saved.keys()
