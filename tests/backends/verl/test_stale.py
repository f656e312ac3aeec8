"""Stale rows (async training) on verl: the config mapping onto verl's rollout correction, and verl's
decoupled loss against alight's `decoupled_policy_loss` on the same tensors.

verl's side is what `build_verl_config` and `correction.apply` make of an alight config and batch,
so a mapping mistake (the wrong anchor, a missing weight, the wrong cap) is a loss mismatch here.
The real workers run it in test_cpu_stale.py.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

import torch
from omegaconf import OmegaConf

from alight.algorithms.batch import TransitionBatch
from alight.backends import losses
from alight.backends.verl import config as vc
from alight.backends.verl import correction
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

from .conftest import PAD, mixed_transitions
from .test_loss_parity import MODES, SEEDS, tensors, verl_worker_loss

NOWHERE = Path("/nonexistent/model"), Path("/nonexistent/run")


def build(mode: str = "async", is_cap: float = 2.0, verl: dict[str, Any] | None = None, **algorithm: Any) -> Any:
    """verl's config for an alight config in `mode` (clip_ratio_high 0.28 as the parity tests')."""
    cfg = ExperimentConfig()
    cfg.trainer.mode, cfg.algorithm.is_cap = mode, is_cap
    cfg.algorithm.clip_ratio_high = 0.28
    for key, value in algorithm.items():
        setattr(cfg.algorithm, key, value)
    if verl is not None:
        cfg.verl = verl
    return vc.build_verl_config(cfg, NOWHERE[0], work_dir=NOWHERE[1])


# -- the config ----------------------------------------------------------------------------------------


def test_sync_is_todays_config_and_async_differs_only_in_the_rollout_correction() -> None:
    sync = OmegaConf.to_container(build("sync"), resolve=False)
    asyn = OmegaConf.to_container(build("async"), resolve=False)
    assert isinstance(sync, dict) and isinstance(asyn, dict)
    defaults = OmegaConf.to_container(vc.verl_defaults().algorithm.rollout_correction, resolve=False)
    assert sync["algorithm"]["rollout_correction"] == defaults and defaults["rollout_is"] is None  # verl's: none
    corr = asyn["algorithm"].pop("rollout_correction")
    sync["algorithm"].pop("rollout_correction")
    assert sync == asyn
    assert corr["rollout_is"] == "token" and corr["rollout_is_threshold"] == 2.0
    assert corr["rollout_rs"] is None and corr["bypass_mode"] is False and corr["rollout_is_batch_normalize"] is False


def test_is_cap_0_is_no_cap_and_the_verl_block_refines_the_correction() -> None:
    assert build(is_cap=0).algorithm.rollout_correction.rollout_is_threshold == math.inf
    assert build(is_cap=3.5).algorithm.rollout_correction.rollout_is_threshold == 3.5
    conf = build(verl={"algorithm": {"rollout_correction": {"rollout_is": "sequence"}}})
    assert conf.algorithm.rollout_correction.rollout_is == "sequence"


@pytest.mark.parametrize("is_cap", [2.0, 0.0])
def test_the_async_config_passes_verls_validation(is_cap: float) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    conf = build(is_cap=is_cap)
    validate_config(conf, use_reference_policy=need_reference_policy(conf), use_critic=need_critic(conf))
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    corr = RolloutCorrectionConfig(**omega_conf_to_dataclass(conf.algorithm).rollout_correction)
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.bypass_mode) == ("token", is_cap or math.inf, False)


def test_verls_bypass_mode_is_a_one_line_config_error(tiny_dir: Path, tmp_path: Path) -> None:
    from alight.backends.verl.backend import VerlBackend

    cfg = ExperimentConfig()
    cfg.trainer.mode = "async"
    cfg.verl = {"algorithm": {"rollout_correction": {"bypass_mode": True}}}

    def no_workers(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("refused before any worker starts")

    with pytest.raises(ConfigError, match=r"bypass_mode is not supported") as err:
        VerlBackend.from_config(cfg, tiny_dir, work_dir=tmp_path, make_workers=no_workers)
    assert "\n" not in str(err.value)


# -- the loss --------------------------------------------------------------------------------------------


@cache
def built(is_cap: float, loss_agg: str) -> Any:
    return build(is_cap=is_cap, loss_agg=loss_agg)


def verl_decoupled(t: dict[str, torch.Tensor], proximal: torch.Tensor, conf: Any, mode: str) -> tuple[Any, ...]:
    """verl's vanilla loss anchored at `proximal`, weighted by verl's own rollout-correction weights."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    from verl.utils.config import omega_conf_to_dataclass

    corr = conf.algorithm.rollout_correction
    weights, _, metrics = compute_rollout_correction_and_rejection_mask(
        proximal, t["old_log_probs"], t["mask"], corr.rollout_is, corr.rollout_is_threshold
    )
    actor = omega_conf_to_dataclass(conf.actor_rollout_ref.actor)
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=proximal,
        log_prob=t["log_probs"],
        advantages=t["advantages"],
        response_mask=t["mask"].bool(),
        loss_agg_mode=vc.LOSS_AGG_MODES[mode],
        config=actor,
        rollout_is_weights=weights.batch["rollout_is_weights"],
    )
    return loss, metrics


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("is_cap", [2.0, 1.2, 0.0])
def test_verls_decoupled_loss_is_alights_decoupled_policy_loss(seed: int, mode: str, is_cap: float) -> None:
    """Behaviour = the tensors' old log-probs; proximal moved away from it by up to e^+-0.7, so
    some tokens pass the cap; the policy within e^+-0.5 of the proximal (no dual clip)."""
    t = tensors(seed)
    g = torch.Generator().manual_seed(100 + seed)
    proximal = t["old_log_probs"] + (torch.rand(t["mask"].shape, generator=g) * 2 - 1) * 0.7
    t["log_probs"] = proximal + (t["log_probs"] - t["old_log_probs"])
    conf = built(is_cap, mode)
    theirs, metrics = verl_decoupled(t, proximal, conf, mode)
    pg, _, _, weight, capped = losses.decoupled_policy_loss(
        t["log_probs"], proximal, t["old_log_probs"], t["advantages"], 0.2, 0.28, is_cap
    )
    assert float(theirs) == pytest.approx(float(losses.aggregate(pg, t["mask"], mode)), abs=1e-5)
    mask = t["mask"].bool()
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(float(weight[mask].mean()), abs=1e-6)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(float(capped[mask].mean()))
    if is_cap == 1.2:
        assert 0 < float(capped[mask].mean()) < 1  # the cap bites on some tokens, not all


def stale_batch() -> tuple[TransitionBatch, torch.Tensor]:
    """The mixed rows, rows 0, 2 and 5 stale, with proximal log-probs off the behaviour ones there."""
    batch = TransitionBatch.from_transitions(mixed_transitions(), PAD)
    batch.mark_stale({"ro-0", "ro-2", "ro-5"})
    g = torch.Generator().manual_seed(3)
    moved = batch.old_log_probs + (torch.rand(batch.old_log_probs.shape, generator=g) * 2 - 1) * 0.9
    stale = batch.stale
    assert stale is not None
    return batch, torch.where(stale[:, None], moved, batch.old_log_probs) * batch.response_mask


@pytest.mark.parametrize("mode", MODES)
def test_the_whole_worker_loss_of_a_stale_batch_is_alights(mode: str) -> None:
    """verl's worker loss (`ppo_loss`) on the batch `correction.apply` makes equals the embedded
    backend's assembly with `decoupled_policy_loss`; the fresh rows' weights are exactly 1."""
    from verl.utils.config import omega_conf_to_dataclass

    from alight.backends.verl.batch import to_data_proto

    batch, proximal = stale_batch()
    conf = build(is_cap=1.5, loss_agg=mode, entropy_coef=0.02)
    actor = omega_conf_to_dataclass(conf.actor_rollout_ref.actor)
    data = to_data_proto(batch)
    metrics = correction.apply(data, proximal, conf)
    assert torch.equal(data.batch["old_log_probs"], proximal)
    assert torch.equal(data.batch["rollout_log_probs"], batch.old_log_probs)
    stale = batch.stale
    assert stale is not None
    weights = data.batch["rollout_is_weights"]
    fresh_tokens = (~stale)[:, None] & batch.response_mask.bool()
    assert bool((weights[fresh_tokens] == 1.0).all())

    g = torch.Generator().manual_seed(7)
    shape = (len(batch), batch.response_length)
    log_probs = proximal + (torch.rand(shape, generator=g) - 0.5) * 0.4
    entropy = torch.rand(shape, generator=g) * 3
    theirs, normaliser = verl_worker_loss(actor, data, batch, mode, log_probs, entropy)
    mask = batch.response_mask
    pg, _, _, weight, capped = losses.decoupled_policy_loss(
        log_probs, proximal, batch.old_log_probs, batch.advantages, 0.2, 0.28, 1.5
    )
    ours = losses.aggregate(pg, mask, mode, normaliser=normaliser)
    ours = ours - 0.02 * losses.aggregate(entropy, mask, mode, normaliser=normaliser)
    assert float(theirs) == pytest.approx(float(ours), abs=1e-5)
    on = mask.bool()
    assert metrics["actor/is_weight_mean"] == pytest.approx(float(weight[on].mean()), abs=1e-6)
    assert metrics["actor/is_capped_frac"] == pytest.approx(float(capped[on].mean()))
    assert 0 < metrics["actor/is_capped_frac"] < 1


def test_a_batch_without_stale_rows_gets_no_proximal_log_probs() -> None:
    batch = TransitionBatch.from_transitions(mixed_transitions(), PAD)
    batch.mark_stale(set())
    correction.proximal_log_probs(batch, lambda part: pytest.fail("no forward pass for a fresh batch"))
    assert batch.stale is None and batch.proximal_log_probs is None


def test_stale_rows_get_the_actors_log_probs_as_their_proximal_ones() -> None:
    batch = TransitionBatch.from_transitions(mixed_transitions(), PAD)
    batch.mark_stale({"ro-1", "ro-5"})
    asked: list[list[str]] = []

    def actor(part: TransitionBatch) -> torch.Tensor:
        asked.append(list(part.meta["rollout_id"]))
        return torch.full((len(part), part.response_length), -0.25)

    correction.proximal_log_probs(batch, actor)
    assert asked == [["ro-1", "ro-5"]]
    proximal = batch.proximal_log_probs
    assert proximal is not None
    mask = batch.response_mask.bool()
    for i in range(len(batch)):
        expected = torch.full_like(proximal[i], -0.25) if i in (1, 5) else batch.old_log_probs[i]
        assert torch.equal(proximal[i][mask[i]], expected[mask[i]]), i
