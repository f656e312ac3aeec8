"""GRPO on a GPU for real: alight's proxy + the vLLM engine + `VerlBackend` (verl's FSDP workers).

A tiny model built here (no hub) serves through the proxy; each step samples groups of answers
through per-rollout URLs, turns the recorded spans into transitions (engine token ids and
log-probs), updates the policy with verl and hands the exported weights to vLLM. It checks that
the served weights change, that after a sync the engine's log-probs equal the actor's
`compute_log_prob` on the same tokens, and that GPU memory stays flat over the steps.
Needs a CUDA GPU plus `pip install "alight[verl]"` (verl, ray, vLLM); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

STEPS = 3
GROUPS, GROUP_SIZE = 2, 4
PROMPTS = ["Say a number.", "Name a colour."]


def _skip_reason() -> str | None:
    for module in ("vllm", "verl", "ray", "tensordict"):
        if importlib.util.find_spec(module) is None:
            return f'{module} is not installed (pip install "alight[verl]")'
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def _gpu_used_mib() -> int:
    """Memory in use on GPU 0 across every process (vLLM's and the Ray workers'), from nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[0])


def _rollouts(server: Any, served: str, step: int) -> list[Any]:
    """GROUPS x GROUP_SIZE sampled answers through per-rollout URLs; their transitions."""
    import openai

    from alight.adapters import SpanAdapter
    from tests.proxy.conftest import new_attempt, spans_of

    adapter = SpanAdapter()

    transitions = []
    for g, prompt in enumerate(PROMPTS[:GROUPS]):
        for i in range(GROUP_SIZE):
            rollout_id, attempt_id = new_attempt(server)
            client = openai.OpenAI(base_url=server.base_url(rollout_id, attempt_id), api_key="x", max_retries=0)
            messages = [{"role": "user", "content": prompt}]
            client.chat.completions.create(model=served, messages=messages, max_tokens=12, temperature=1.0)  # type: ignore[arg-type]
            (transition,) = adapter.adapt(spans_of(server, rollout_id), rollout_id=rollout_id).transitions
            reward = float(i % 2)  # half of each group "right": non-zero GRPO advantages
            transitions.append(
                transition.model_copy(update={"reward": reward, "group_id": f"s{step}-g{g}", "advantage": reward - 0.5})
            )
    return transitions


def test_grpo_steps_through_the_proxy_vllm_and_verl(tmp_path: Path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    from transformers import AutoTokenizer

    from alight.algorithms.batch import TransitionBatch
    from alight.backends.verl.backend import VerlBackend
    from alight.backends.verl.batch import to_data_proto
    from alight.config.schema import AlgorithmConfig, ExperimentConfig
    from alight.engines.vllm_engine import VLLMEngine
    from alight.models.tiny import build_tiny_model
    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    model_dir = tmp_path / "tiny"
    build_tiny_model(model_dir, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cfg = ExperimentConfig(algorithm=AlgorithmConfig(lr=1e-3, micro_batch_size=8))
    cfg = replace(cfg, trainer=replace(cfg.trainer, backend="verl", device="cuda"))
    VerlBackend.check_config(cfg)

    engine = VLLMEngine(
        model_dir, work_dir=tmp_path / "vllm", gpu_memory_utilization=0.25, extra_args=["--enforce-eager"]
    )
    served = engine.model_names[0]
    backend = VerlBackend.from_config(cfg, model_dir, work_dir=tmp_path / "verl")
    used: list[int] = []
    try:
        with ProxyServer(Proxy(engine, MemoryStore(), version=0)) as server:
            for step in range(1, STEPS + 1):
                batch = TransitionBatch.from_transitions(_rollouts(server, served, step), pad)
                assert batch.has_old_log_probs.all()  # vLLM returned the sampled tokens' log-probs
                before = batch.old_log_probs.clone()
                metrics = backend.update(batch)
                assert metrics["actor/update_tokens"] > 0 and torch.isfinite(torch.tensor(metrics["actor/loss"]))
                weights = backend.engine_weights()
                server.update_weights(weights, step)
                used.append(_gpu_used_mib())

                # fresh samples from the served (new) weights
                after_batch = TransitionBatch.from_transitions(_rollouts(server, served, 100 + step), pad)
                actor = backend._log_probs(to_data_proto(after_batch, temperature=1.0), reference=False)
                engine_lp = after_batch.old_log_probs
                mask = after_batch.response_mask.bool()
                # after the sync the engine's log-probs are the actor's (bf16 kernels differ slightly)
                assert (actor[mask] - engine_lp[mask]).abs().mean() < 0.02
                assert (actor[mask] - engine_lp[mask]).abs().max() < 0.2
                old = backend._log_probs(to_data_proto(batch, temperature=1.0), reference=False)
                assert not torch.allclose(
                    old[batch.response_mask.bool()], before[batch.response_mask.bool()], atol=1e-3
                )
    finally:
        backend.close()
    # GPU memory flat over the steps: no growth beyond allocator noise after the first step
    assert max(used) - used[0] < 256, used
