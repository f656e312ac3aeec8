"""The shape the project describes, for real on a CPU: alight starts a vLLM server (vLLM's CPU build,
in a venv of its own), runners run the calc agent against it through the proxy, the embedded backend
trains, and the server loads each update's weights. Sync and async. The logged gap between the
log-probs vLLM recorded and the trainer's forward on the same weights stays at fp32 noise: the
served weights are the trained ones at every step (a stale layer after a reload would show here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.test_fit_calc import REPO, short_config

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: fp32 on both sides: vLLM's CPU kernels against transformers' (measured ~1e-6 on the tiny model)
GAP_MEAN, GAP_MAX = 1e-3, 2e-2


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_calc_trains_on_a_vllm_server_alight_started(
    mode: str, real_vllm_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.trainer import Trainer

    monkeypatch.chdir(REPO)
    cfg = short_config(
        tmp_path,
        "engine.kind=vllm",
        f"+engine.options.python={real_vllm_python}",
        "+engine.options.kv_cache_gib=1",
        "+engine.options.dtype=float32",
        f"trainer.mode={mode}",
        f"trainer.steps={1 if mode == 'sync' else 2}",  # async: step 2 trains on rows step 1's weights served
        "warm_start.steps=0",  # the served weights' gap, not what they know: an untrained model will do
        "trainer.val_every=0",  # validation at step 0 and the last
        "data.val_size=2",
    )
    result = Trainer(cfg).fit()
    steps = 1 if mode == "sync" else 2
    assert result.steps == steps and not result.stopped
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(steps + 1))
    for m in lines[1:]:
        assert m["rollouts/succeeded"] >= 1 and m["weights_version"] == m["step"]
        assert m["actor/optimizer_steps"] >= 1
        if mode == "async" and m["step"] > 1 and "actor/logprob_gap_mean" not in m:
            continue  # every row stale (served by older weights): the gap is measured on fresh rows only
        assert m["actor/logprob_gap_mean"] < GAP_MEAN and m["actor/logprob_gap_max"] < GAP_MAX, m


def test_the_documented_command_names_the_vllm_venv() -> None:
    """docs/gpu.md's command resolves to the vLLM engine in the venv README's test command builds."""
    import subprocess
    import sys

    import yaml

    args = ["train", "configs/calc_smol.yaml", "engine.kind=vllm", "+engine.options.python=.venv-vllm/bin/python"]
    done = subprocess.run(
        [sys.executable, "-m", "alight", *args, "--cfg"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    engine = yaml.safe_load(done.stdout)["engine"]
    assert engine["kind"] == "vllm" and engine["options"] == {"python": ".venv-vllm/bin/python"}
