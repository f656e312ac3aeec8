"""alight's losses against verl's on the same tensors: where they agree, and the one place they do not.

verl's side is configured the way `build_verl_config` configures it (its `ActorConfig` built from
an alight `AlgorithmConfig`), so a mapping mistake shows up here as a loss mismatch too.

Documented differences (asserted below, not hidden):
- dual clip: verl's vanilla loss bounds a token with A < 0 by -A * clip_ratio_c (3.0); alight does
  not. Equal wherever A >= 0 or the ratio is at most clip_ratio_c; `clip_ratio_c: 1e9` removes it.
- seq-mean modes without global batch info (verl's local fallback) divide by the rows that have a
  loss token, alight by all rows. verl's workers always pass the step's row count
  (`global_batch_size`), and then the two agree, fully masked rows included.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

import torch

from alight.backends import losses
from alight.backends.verl import config as vc
from alight.config.schema import ExperimentConfig

SEEDS = [0, 1, 2, 3, 4]
MODES = list(losses.LOSS_AGGREGATIONS)
B, R = 6, 9


@cache
def verl_actor(loss_agg: str, clip_low: float = 0.2, clip_high: float = 0.28, clip_ratio_c: float | None = None) -> Any:
    """verl's ActorConfig for an alight AlgorithmConfig, through `build_verl_config`."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = ExperimentConfig()
    cfg.algorithm.loss_agg = loss_agg
    cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high = clip_low, clip_high
    if clip_ratio_c is not None:
        cfg.verl = {"actor_rollout_ref": {"actor": {"clip_ratio_c": clip_ratio_c}}}
    conf = vc.build_verl_config(cfg, Path("/nonexistent/model"), work_dir=Path("/nonexistent/run"))
    return omega_conf_to_dataclass(conf.actor_rollout_ref.actor)


def tensors(seed: int, *, spread: float = 0.5, empty_row: bool = False) -> dict[str, torch.Tensor]:
    """log-probs, old log-probs (ratios around exp(+-spread)), per-row advantages of both signs and
    a mask with right padding and holes (trajectory rows); optionally a row with no loss token."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, R, generator=g) * 3
    new = old + (torch.rand(B, R, generator=g) * 2 - 1) * spread
    advantages = (torch.randn(B, 1, generator=g) * 1.5).expand(B, R).clone()
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = (torch.arange(R)[None, :] < lengths[:, None]).long()
    mask[1, 0] = 0  # a hole, as inserted tool tokens leave
    mask[1, -1] = 1
    if empty_row:
        mask[3] = 0
    return {"log_probs": new, "old_log_probs": old, "advantages": advantages, "mask": mask}


def verl_policy_loss(t: dict[str, torch.Tensor], actor: Any, mode: str | None = None) -> tuple[torch.Tensor, dict]:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    return fn(
        old_log_prob=t["old_log_probs"],
        log_prob=t["log_probs"],
        advantages=t["advantages"],
        response_mask=t["mask"].bool(),
        loss_agg_mode=mode or actor.loss_agg_mode,
        config=actor,
    )


def alight_policy_loss(t: dict[str, torch.Tensor], mode: str, **aggregate: Any) -> tuple[torch.Tensor, ...]:
    token, clipped, approx_kl = losses.clipped_policy_loss(
        t["log_probs"], t["old_log_probs"], t["advantages"], 0.2, 0.28
    )
    return losses.aggregate(token, t["mask"], mode, **aggregate), clipped, approx_kl


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_matches_verls_vanilla_loss(seed: int, mode: str) -> None:
    from verl.utils.torch_functional import masked_mean

    actor = verl_actor(mode)
    assert actor.loss_agg_mode == vc.LOSS_AGG_MODES[mode] and actor.policy_loss.loss_mode == "vanilla"
    t = tensors(seed)
    verl_loss, metrics = verl_policy_loss(t, actor)
    loss, clipped, approx_kl = alight_policy_loss(t, mode)
    assert float(loss) == pytest.approx(float(verl_loss), abs=1e-5)
    mask = t["mask"].bool()
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(masked_mean(clipped, mask)), abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(masked_mean(approx_kl, mask)), abs=1e-6)
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # both branches of the clip are exercised


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_batch_info_add_up_as_alights_normaliser(seed: int, mode: str) -> None:
    """verl's workers split a step into micro-batches and pass the step's token and row counts;
    alight's embedded backend passes the same counts as `normaliser`."""
    from verl.trainer.ppo.core_algos import agg_loss

    t = tensors(seed, empty_row=True)
    token, _, _ = losses.clipped_policy_loss(t["log_probs"], t["old_log_probs"], t["advantages"], 0.2, 0.28)
    tokens, rows = int(t["mask"].sum()), B
    normaliser = float(tokens) if mode == "token_mean" else float(rows)
    verl_total = alight_total = 0.0
    for part in (slice(0, 2), slice(2, B)):
        verl_total += float(
            agg_loss(
                token[part], t["mask"][part], vc.LOSS_AGG_MODES[mode], batch_num_tokens=tokens, global_batch_size=rows
            )
        )
        alight_total += float(losses.aggregate(token[part], t["mask"][part], mode, normaliser=normaliser))
    assert alight_total == pytest.approx(verl_total, abs=1e-5)
    assert alight_total == pytest.approx(float(losses.aggregate(token, t["mask"], mode)), abs=1e-5)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_verls_local_seq_mean_skips_rows_without_loss_tokens(seed: int, mode: str) -> None:
    t = tensors(seed, empty_row=True)
    verl_loss, _ = verl_policy_loss(t, verl_actor(mode))
    loss, _, _ = alight_policy_loss(t, mode)
    rows_with_tokens = int((t["mask"].sum(1) > 0).sum())
    assert rows_with_tokens == B - 1
    assert float(verl_loss) == pytest.approx(float(loss) * B / rows_with_tokens, abs=1e-5)
    assert abs(float(verl_loss) - float(loss)) > 1e-4  # a real difference, not rounding


def per_token(t: dict[str, torch.Tensor], actor: Any) -> torch.Tensor:
    """verl's per-token loss: its vanilla loss on a one-token mask, summed (verl's token-sum mode)."""
    out = torch.zeros(B, R)
    for i in range(B):
        for j in range(R):
            one = torch.zeros(B, R, dtype=torch.long)
            one[i, j] = 1
            out[i, j] = verl_policy_loss({**t, "mask": one}, actor, "token-sum")[0]
    return out


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_dual_clip_is_the_one_difference_in_the_policy_loss(seed: int) -> None:
    t = tensors(seed, spread=2.5)  # ratios up to e^2.5 ~ 12: far off-policy tokens
    alight_token, _, _ = losses.clipped_policy_loss(t["log_probs"], t["old_log_probs"], t["advantages"], 0.2, 0.28)
    verl_token = per_token(t, verl_actor("token_mean"))
    ratio = (t["log_probs"] - t["old_log_probs"]).exp()
    bounded = (t["advantages"] < 0) & (ratio > 3.0)
    assert bounded.any() and (~bounded).any()
    assert torch.allclose(verl_token[~bounded], alight_token[~bounded], atol=1e-5)
    assert torch.allclose(verl_token[bounded], -t["advantages"][bounded] * 3.0, atol=1e-5)
    assert (verl_token[bounded] < alight_token[bounded] - 1e-3).all()
    # the documented switch: a huge clip_ratio_c through the verl: block
    unbounded = per_token(t, verl_actor("token_mean", clip_ratio_c=1e9))
    assert torch.allclose(unbounded, alight_token, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("estimator", list(losses.KL_ESTIMATORS))
def test_kl_penalty_matches_verls(seed: int, estimator: str) -> None:
    from verl.trainer.ppo.core_algos import kl_penalty

    g = torch.Generator().manual_seed(seed)
    log_probs = -torch.rand(B, R, generator=g) * 5
    ref = log_probs + torch.randn(B, R, generator=g) * 2
    ref[0, :3] = torch.tensor([-40.0, 40.0, 15.0]) + log_probs[0, :3]  # verl's clamps at 20 and 10
    ours = losses.kl_penalty(log_probs, ref, estimator)
    theirs = kl_penalty(log_probs, ref, vc.KL_LOSS_TYPES[estimator])
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-6)
    for mode in MODES:  # and aggregated as verl's ppo_loss aggregates its kl term
        from verl.trainer.ppo.core_algos import agg_loss

        mask = tensors(seed)["mask"]
        ours_agg = float(losses.aggregate(ours, mask, mode))
        assert ours_agg == pytest.approx(float(agg_loss(theirs, mask.bool(), vc.LOSS_AGG_MODES[mode])), abs=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_entropy_matches_verls_on_temperature_scaled_logits(seed: int, temperature: float) -> None:
    """verl's engines divide the logits by the temperature, then take `entropy_from_logits`."""
    from verl.utils.torch_functional import entropy_from_logits

    logits = torch.randn(B, R, 50, generator=torch.Generator().manual_seed(seed)) * 4
    theirs = entropy_from_logits(logits / temperature)
    assert torch.allclose(losses.entropy(logits, temperature), theirs, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_log_probs_match_verls_at_the_engines_temperature(seed: int) -> None:
    from verl.utils.torch_functional import logprobs_from_logits

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, R, 50, generator=g) * 3
    targets = torch.randint(0, 50, (B, R), generator=g)
    for temperature in (1.0, 0.6):
        theirs = logprobs_from_logits(logits / temperature, targets)
        assert torch.allclose(losses.token_log_probs(logits, targets, temperature), theirs, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_the_whole_actor_loss_matches_verls_ppo_loss(mode: str) -> None:
    """verl's worker loss (`verl.workers.utils.losses.ppo_loss`, fed the no-padding batch its
    trainer builds from `to_data_proto`) equals the embedded backend's assembly: policy loss minus
    entropy_coef times entropy plus kl_coef times KL, each aggregated with the step's normaliser."""
    from verl.utils.config import omega_conf_to_dataclass

    from alight.algorithms.batch import TransitionBatch
    from alight.backends.verl.batch import to_data_proto

    from .conftest import PAD, mixed_transitions

    batch = TransitionBatch.from_transitions(mixed_transitions(), PAD)
    cfg = ExperimentConfig()
    cfg.algorithm.loss_agg, cfg.algorithm.kl_coef, cfg.algorithm.entropy_coef = mode, 0.3, 0.02
    cfg.algorithm.kl_estimator, cfg.algorithm.clip_ratio_high = "low_var_kl", 0.28
    conf = vc.build_verl_config(cfg, Path("/nonexistent/model"), work_dir=Path("/nonexistent/run"))
    actor = omega_conf_to_dataclass(conf.actor_rollout_ref.actor)

    g = torch.Generator().manual_seed(7)
    shape = (len(batch), batch.response_length)
    log_probs = batch.old_log_probs + (torch.rand(shape, generator=g) - 0.5)
    ref = batch.old_log_probs + (torch.rand(shape, generator=g) - 0.5)
    entropy = torch.rand(shape, generator=g) * 3
    data = to_data_proto(batch)
    data.batch["ref_log_prob"] = ref
    theirs, normaliser = verl_worker_loss(actor, data, batch, mode, log_probs, entropy)
    mask = batch.response_mask
    pg, _, _ = losses.clipped_policy_loss(log_probs, batch.old_log_probs, batch.advantages, 0.2, 0.28)
    ours = losses.aggregate(pg, mask, mode, normaliser=normaliser)
    ours = ours - 0.02 * losses.aggregate(entropy, mask, mode, normaliser=normaliser)
    kl = losses.kl_penalty(log_probs, ref, "low_var_kl")
    ours = ours + 0.3 * losses.aggregate(kl, mask, mode, normaliser=normaliser)
    assert float(theirs) == pytest.approx(float(ours), abs=1e-5)


def verl_worker_loss(
    actor: Any, data: Any, batch: Any, mode: str, log_probs: torch.Tensor, entropy: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """verl's worker loss (`ppo_loss`) on `data` in the layout its trainer hands over (the step's
    token and row counts set), given the model's `log_probs` and `entropy` [B, R]; and the
    normaliser alight's embedded backend uses for `mode` on the same step."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from alight.backends.verl.batch import to_no_padding

    td = to_no_padding(data)
    tokens, rows = int(batch.response_mask.sum()), len(batch)
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=tokens, global_batch_size=rows)
    output = {"log_probs": as_model_output(batch, log_probs), "entropy": as_model_output(batch, entropy)}
    loss, _ = ppo_loss(actor, output, td)
    return loss, float(tokens) if mode == "token_mean" else float(rows)


def as_model_output(batch: Any, values: torch.Tensor) -> torch.Tensor:
    """[B, R] response values as verl's model output: jagged rows of each row's real tokens."""
    out = []  # the model's output at position t is about token t + 1: response token k sits at p + k - 1
    for i in range(len(batch)):
        p, r = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        row = torch.zeros(p + r)
        row[p - 1 : p + r - 1] = values[i, :r]
        out.append(row)
    return torch.nested.as_nested_tensor(out, layout=torch.jagged)
