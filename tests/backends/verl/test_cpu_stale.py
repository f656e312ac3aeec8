"""A stale batch (async training) through verl 0.9.1's real FSDP workers on CPU.

No stand-ins: `VerlBackend` on verl's workers (`verl.trainer.device: cpu`, one rank, micro-batches
of 2, float32), `trainer.mode: async`. The rows' behaviour log-probs are an independent
transformers pass's, shifted per token so the importance weight p_prox / p_behav is e^-0.4,
e^0.3 or e^1.0 (over the cap 2.0); the proximal policy is the actor before the update, which is
that same model. So verl's first forward pass sits on the proximal policy (ratio 1), and its
reported policy loss must be alight's `decoupled_policy_loss` there: -A * min(w, is_cap) over the
tokens, as a hand computation gives it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("tensordict")

import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends import losses
from alight.backends.verl.backend import VerlBackend
from alight.config.schema import AlgorithmConfig, ExperimentConfig, TrainerConfig
from tests.backends.test_conformance import load_policy, on_policy, rows, token_log_probs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("verl_ray")]

PAD = 0
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.0]
STALE = {"ro-0", "ro-1", "ro-3"}
SHIFTS = [-0.4, 0.3, 1.0]  # log p_prox - log p_behav, per token in turn
IS_CAP = 2.0


@pytest.fixture(scope="module")
def backend(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerlBackend]:
    tmp = tmp_path_factory.mktemp("stale")
    cfg = ExperimentConfig(
        algorithm=AlgorithmConfig(lr=1e-2, micro_batch_size=2, is_cap=IS_CAP),
        trainer=TrainerConfig(backend="verl", seed=0, n_gpus_per_node=1, output_dir=str(tmp), mode="async"),
        verl={"trainer": {"device": "cpu"}},
    )
    VerlBackend.check_config(cfg)
    made = VerlBackend.from_config(cfg, tiny_dir, work_dir=tmp / "work")
    try:
        yield made
    finally:
        made.close()


def test_a_stale_batch_trains_with_the_truncated_importance_weights(backend: VerlBackend, tiny_dir: Path) -> None:
    start = load_policy(tiny_dir, str(tiny_dir))
    plain = rows(ADVANTAGES, seed=1)
    true = [token_log_probs(start, row) for row in plain]
    behaviour = [
        [lp - SHIFTS[k % 3] for k, lp in enumerate(lps)] if row.rollout_id in STALE else lps
        for row, lps in zip(plain, true, strict=True)
    ]
    batch = TransitionBatch.from_transitions(rows(ADVANTAGES, seed=1, logprobs=behaviour), PAD)
    batch.mark_stale(STALE)
    before = {k: v.clone() for k, v in load_policy(tiny_dir, backend.engine_weights()).state_dict().items()}

    metrics = backend.update(batch)

    # the proximal log-probs are the actor's before the update: the independent pass's
    proximal = batch.proximal_log_probs
    assert proximal is not None
    for i, lps in enumerate(true):
        assert torch.allclose(proximal[i, : len(lps)], torch.tensor(lps), atol=1e-5), i
    # hand computation: at ratio 1 each token's loss is -A * min(w, cap), token-mean over the batch
    weights = [
        [min(math.exp(SHIFTS[k % 3]), IS_CAP) if row.rollout_id in STALE else 1.0 for k in range(len(lps))]
        for row, lps in zip(plain, true, strict=True)
    ]
    flat = [(w, ADVANTAGES[i]) for i, ws in enumerate(weights) for w in ws]
    by_hand = sum(-a * w for w, a in flat) / len(flat)
    assert metrics["actor/pg_loss"] == pytest.approx(by_hand, abs=1e-4)
    mask = batch.response_mask
    pg, *_ = losses.decoupled_policy_loss(  # the policy at the proximal weights
        proximal, proximal, batch.old_log_probs, batch.advantages, 0.2, 0.2, IS_CAP
    )
    assert metrics["actor/pg_loss"] == pytest.approx(float(losses.aggregate(pg, mask, "token_mean")), abs=1e-4)
    # the IS metrics, in alight's names
    assert metrics["actor/is_weight_mean"] == pytest.approx(sum(w for w, _ in flat) / len(flat), abs=1e-5)
    capped_tokens = sum(1 for w, _ in flat if w == IS_CAP)
    assert metrics["actor/is_capped_frac"] == pytest.approx(capped_tokens / len(flat), abs=1e-6)
    assert capped_tokens > 0 and abs(metrics["actor/ppo_kl"]) < 1e-5  # ratio 1 to the proximal policy
    after = load_policy(tiny_dir, backend.engine_weights()).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the weights moved

    # a fresh batch on the moved weights: no correction, every weight 1 (today's loss)
    fresh = TransitionBatch.from_transitions(
        on_policy(load_policy(tiny_dir, backend.engine_weights()), ADVANTAGES), PAD
    )
    again = backend.update(fresh)
    assert fresh.proximal_log_probs is None
    assert again["actor/is_weight_mean"] == 1.0 and again["actor/is_capped_frac"] == 0.0
    n = int(fresh.response_mask.sum())
    on_policy_loss = float((-fresh.advantages * fresh.response_mask).sum()) / n
    assert again["actor/pg_loss"] == pytest.approx(on_policy_loss, abs=1e-4)
