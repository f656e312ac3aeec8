"""verl 0.9.1's real FSDP workers on CPU (`verl.trainer.device: cpu`), driven by `VerlBackend`.

No stand-ins: Ray actors run verl's `ActorRolloutRefWorker` and `TrainingWorker` through alight's
CPU platform (`alight.backends.verl.cpu_platform`), in float32. Two backends, each started once for
the module (a start costs ~15-30 s here; an update < 1 s):

- GRPO with a KL penalty on 2 ranks (a separate reference worker), micro-batches of 2;
- PPO with the critic and LoRA on 1 rank (the reference is the actor with its adapters off).

Expected log-probs come from an independent plain transformers forward pass over each row's own
tokens (`tests/backends/test_conformance.py`). Both backends take 5-row batches, which are not whole
micro-batches on any rank: rows padded to the world only fail verl's fixed micro-batching (the
first GPU bug); the critic loads without flash-attn (the second).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("tensordict")

import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.verl.backend import VerlBackend
from alight.config.schema import AlgorithmConfig, ExperimentConfig, LoraConfig, TrainerConfig
from alight.types import Transition
from tests.backends.test_conformance import load_policy, on_policy, rows, token_log_probs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("verl_ray")]

PAD = 0
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.0]  # 5 rows: not whole micro-batches of 2 on 1 or 2 ranks


def backend_for(tmp: Path, model_dir: Path, *, world: int, **algorithm: Any) -> VerlBackend:
    cfg = ExperimentConfig(
        algorithm=AlgorithmConfig(lr=1e-2, micro_batch_size=2, **algorithm),
        trainer=TrainerConfig(backend="verl", seed=0, n_gpus_per_node=world, output_dir=str(tmp)),
        verl={"trainer": {"device": "cpu"}},
    )
    VerlBackend.check_config(cfg)
    return VerlBackend.from_config(cfg, model_dir, work_dir=tmp / "work")


@pytest.fixture(scope="module")
def grpo(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerlBackend]:
    backend = backend_for(tmp_path_factory.mktemp("grpo"), tiny_dir, world=2, kl_coef=0.5)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="module")
def ppo_lora(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerlBackend]:
    lora = LoraConfig(enabled=True, r=4, alpha=8)
    backend = backend_for(tmp_path_factory.mktemp("ppo"), tiny_dir, world=1, name="ppo", kl_coef=0.5, lora=lora)
    try:
        yield backend
    finally:
        backend.close()


def batch(transitions: list[Transition]) -> TransitionBatch:
    return TransitionBatch.from_transitions(transitions, PAD)


def actor_log_probs(backend: VerlBackend, transitions: list[Transition], *, reference: bool = False) -> torch.Tensor:
    from alight.backends.verl.batch import to_data_proto

    return backend._log_probs(to_data_proto(batch(transitions)), reference=reference)


def assert_log_probs_equal(got: torch.Tensor, model: Any, transitions: list[Transition], atol: float) -> None:
    """`got` [B, R] against the independent forward pass, on each row's response tokens."""
    worst = 0.0
    for i, row in enumerate(transitions):
        expected = torch.tensor(token_log_probs(model, row))
        worst = max(worst, float((got[i, : len(expected)] - expected).abs().max()))
    assert worst < atol, worst


def served(backend: VerlBackend, tiny_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_policy(tiny_dir, backend.engine_weights()).state_dict().items()}


# -- GRPO + KL, 2 ranks ------------------------------------------------------------------------------


def test_the_actors_log_probs_equal_a_plain_transformers_pass_on_two_ranks(grpo: VerlBackend, tiny_dir: Path) -> None:
    assert grpo._world_size() == 2 and grpo.workers.ref is not None
    start = load_policy(tiny_dir, str(tiny_dir))
    transitions = rows(ADVANTAGES, seed=1)
    assert_log_probs_equal(actor_log_probs(grpo, transitions), start, transitions, atol=1e-5)
    assert_log_probs_equal(actor_log_probs(grpo, transitions, reference=True), start, transitions, atol=1e-5)


def test_grpo_with_kl_updates_then_save_and_load_restore_it_exactly(
    grpo: VerlBackend, tiny_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    start = load_policy(tiny_dir, str(tiny_dir))
    before = served(grpo, tiny_dir)
    first = on_policy(start, ADVANTAGES)
    metrics = grpo.update(batch(first))
    assert abs(metrics["actor/ppo_kl"]) < 1e-5 and metrics["actor/pg_clipfrac"] == 0.0  # on-policy: ratio 1
    after = served(grpo, tiny_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the weights moved
    metrics = grpo.update(batch(first))
    assert metrics["actor/kl"] > 0.0  # the policy left the reference, which did not move
    assert_log_probs_equal(actor_log_probs(grpo, first, reference=True), start, first, atol=1e-5)

    grpo.save(tmp_path / "ckpt")
    saved = served(grpo, tiny_dir)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")  # the checkpoint is a model directory
    assert all(torch.equal(v, saved[k]) for k, v in exported.state_dict().items() if k in saved)
    moved = on_policy(load_policy(tiny_dir, grpo.engine_weights()), ADVANTAGES, seed=2)
    grpo.update(batch(moved))
    next_step = served(grpo, tiny_dir)
    grpo.load(tmp_path / "ckpt")
    assert grpo.steps == 2
    loaded = served(grpo, tiny_dir)
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)  # weights exact
    grpo.update(batch(moved))  # the optimizer came back too: the same update lands on the same weights
    again = served(grpo, tiny_dir)
    assert all(torch.allclose(next_step[k], again[k], atol=1e-6) for k in next_step)


# -- PPO + critic + LoRA, 1 rank ---------------------------------------------------------------------


def test_ppo_loads_the_critic_without_flash_attn_and_updates_actor_and_critic(
    ppo_lora: VerlBackend, tiny_dir: Path
) -> None:
    assert importlib.util.find_spec("flash_attn") is None  # verl's own loader would fail to load the critic here
    assert ppo_lora._world_size() == 1 and ppo_lora.workers.critic is not None and ppo_lora.ref_in_actor
    start = load_policy(tiny_dir, str(tiny_dir))
    transitions = on_policy(start, ADVANTAGES)
    # LoRA's B starts at 0: the actor (adapters on) and the reference (adapters off) are the base model
    assert_log_probs_equal(actor_log_probs(ppo_lora, transitions), start, transitions, atol=1e-5)
    before = served(ppo_lora, tiny_dir)
    metrics = ppo_lora.update(batch(transitions))
    assert metrics["critic/loss"] > 0.0 and "critic/vpred_mean" in metrics
    assert torch.isfinite(torch.tensor(metrics["actor/loss"]))
    after = served(ppo_lora, tiny_dir)  # merged LoRA weights: the served model changed
    assert any(not torch.equal(before[k], after[k]) for k in before)
    ppo_lora.update(batch(transitions))
    moved = load_policy(tiny_dir, ppo_lora.engine_weights())
    # verl's merged-LoRA export rounds the merged weights to bfloat16 (its rollout sync does): the
    # served model is the actor's within that rounding, not within float32's
    assert_log_probs_equal(actor_log_probs(ppo_lora, transitions), moved, transitions, atol=5e-3)
    assert_log_probs_equal(actor_log_probs(ppo_lora, transitions, reference=True), start, transitions, atol=1e-5)


def test_the_critic_loader_honours_the_configured_attention(tiny_dir: Path) -> None:
    """verl's `load_valuehead_model` asks for flash_attention_2 whatever the config says; alight's
    asks for the config's (sdpa without flash-attn). Runs in this process, no Ray."""
    from transformers import AutoConfig

    from alight.backends.verl.workers import load_value_model

    config = AutoConfig.from_pretrained(tiny_dir, attn_implementation="sdpa")
    config.num_labels = 1
    model = load_value_model(str(tiny_dir), torch.float32, config, False)
    assert model.config._attn_implementation == "sdpa"
    assert model.score.out_features == 1
