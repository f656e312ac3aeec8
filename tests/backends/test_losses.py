"""The policy-gradient losses on small hand-computed tables."""

from __future__ import annotations

import math

import pytest
import torch

from alight.backends import losses

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OLD = math.log(0.4)  # any old log-prob: only the ratio matters

# (advantage, ratio, clip_low, clip_high, loss, clipped term taken)
CLIPPED = [
    (1.0, 1.1, 0.2, 0.2, -1.1, 0.0),  # inside the range: the plain ratio
    (-2.0, 0.9, 0.2, 0.2, 1.8, 0.0),
    (1.0, 1.5, 0.2, 0.2, -1.2, 1.0),  # A > 0, ratio above 1 + high: capped
    (1.0, 0.5, 0.2, 0.2, -0.5, 0.0),  # A > 0, ratio below 1 - low: the worse (unclipped) term
    (-1.0, 1.5, 0.2, 0.2, 1.5, 0.0),  # A < 0, ratio above: the worse (unclipped) term
    (-1.0, 0.5, 0.2, 0.2, 0.8, 1.0),  # A < 0, ratio below 1 - low: floored
    (1.0, 1.5, 0.2, 0.28, -1.28, 1.0),  # asymmetric (DAPO's clip-higher)
    (-1.0, 0.5, 0.1, 0.28, 0.9, 1.0),
    (-1.0, 1.25, 0.1, 0.28, 1.25, 0.0),
    (0.0, 3.0, 0.2, 0.2, 0.0, 0.0),  # no advantage, no loss, nothing clipped
]


@pytest.mark.parametrize(("advantage", "ratio", "low", "high", "loss", "clipped"), CLIPPED)
def test_clipped_policy_loss(
    advantage: float, ratio: float, low: float, high: float, loss: float, clipped: float
) -> None:
    old = torch.tensor([[OLD]], dtype=torch.float64)
    new = old + math.log(ratio)
    got, was_clipped, approx_kl = losses.clipped_policy_loss(new, old, torch.tensor([[advantage]]), low, high)
    assert got.item() == pytest.approx(loss)
    assert was_clipped.item() == clipped
    assert approx_kl.item() == pytest.approx(-math.log(ratio))  # k1 of KL(old || new)


def test_clipped_policy_loss_is_elementwise_and_has_the_ratio_gradient() -> None:
    old = torch.full((2, 3), OLD)
    new = (old + torch.tensor([[0.0, math.log(1.5), math.log(0.5)], [0.0, 0.0, 0.0]])).requires_grad_(True)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, clipped, _ = losses.clipped_policy_loss(new, old, advantages)
    assert loss.shape == clipped.shape == (2, 3)
    loss.sum().backward()
    assert new.grad is not None
    # d(-A r)/d log p = -A r where unclipped; 0 where the clipped (constant) term is taken
    expected = torch.tensor([[-1.0, 0.0, -0.5], [1.0, 1.0, 1.0]])
    assert torch.allclose(new.grad, expected)


# (log p - log q, kl, abs, mse, low_var_kl)
KL = [
    (0.0, 0.0, 0.0, 0.0, 0.0),
    (0.5, 0.5, 0.5, 0.125, math.exp(-0.5) + 0.5 - 1.0),
    (-0.5, -0.5, 0.5, 0.125, math.exp(0.5) - 0.5 - 1.0),
    (2.0, 2.0, 2.0, 2.0, math.exp(-2.0) + 2.0 - 1.0),
    (-30.0, -30.0, 30.0, 450.0, 10.0),  # low_var_kl is clamped at 10
]


@pytest.mark.parametrize(("diff", "kl", "abs_", "mse", "low_var"), KL)
def test_kl_estimators(diff: float, kl: float, abs_: float, mse: float, low_var: float) -> None:
    ref = torch.tensor([[math.log(0.3)]], dtype=torch.float64)
    log_probs = ref + diff
    for estimator, expected in (("kl", kl), ("abs", abs_), ("mse", mse), ("low_var_kl", low_var)):
        assert losses.kl_penalty(log_probs, ref, estimator).item() == pytest.approx(expected), estimator


def test_low_var_kl_is_non_negative_and_zero_only_when_equal() -> None:
    generator = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(4, 16, generator=generator) * 5
    ref = -torch.rand(4, 16, generator=generator) * 5
    assert (losses.kl_penalty(log_probs, ref, "low_var_kl") >= 0).all()
    assert (losses.kl_penalty(log_probs, ref, "low_var_kl") > 0).all()
    assert torch.equal(losses.kl_penalty(log_probs, log_probs, "low_var_kl"), torch.zeros(4, 16))


def test_unknown_kl_estimator_and_aggregation_are_value_errors() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="KL estimator"):
        losses.kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="loss aggregation"):
        losses.aggregate(x, x, "sum")


VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])

# (mode, normaliser, expected)
AGGREGATE = [
    ("token_mean", None, 7 / 3),  # (1 + 2 + 4) / 3 tokens
    ("seq_mean_token_mean", None, (1.5 + 4.0) / 2),
    ("seq_mean_token_sum", None, (3.0 + 4.0) / 2),
    ("token_mean", 7.0, 1.0),  # the normaliser replaces the token count
    ("seq_mean_token_mean", 4.0, 5.5 / 4),  # ... and the row count
    ("seq_mean_token_sum", 4.0, 7.0 / 4),
]


@pytest.mark.parametrize(("mode", "normaliser", "expected"), AGGREGATE)
def test_aggregate(mode: str, normaliser: float | None, expected: float) -> None:
    assert losses.aggregate(VALUES, MASK, mode, normaliser=normaliser).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "normaliser"),
    [("token_mean", 3.0), ("seq_mean_token_mean", 2.0), ("seq_mean_token_sum", 2.0)],  # tokens / rows of the step
)
def test_micro_batches_with_the_step_normaliser_add_up_to_the_full_batch(mode: str, normaliser: float) -> None:
    parts = [losses.aggregate(VALUES[i : i + 1], MASK[i : i + 1], mode, normaliser=normaliser).item() for i in range(2)]
    assert sum(parts) == pytest.approx(losses.aggregate(VALUES, MASK, mode).item())


def test_fully_masked_values_aggregate_to_zero_not_nan() -> None:
    mask = torch.tensor([[0, 0, 0], [1, 0, 0]])
    assert losses.aggregate(VALUES, torch.zeros_like(MASK), "token_mean").item() == 0.0
    assert losses.aggregate(VALUES, mask, "seq_mean_token_mean").item() == pytest.approx(2.0)  # (0 + 4) / 2


def test_nll_loss_is_the_aggregated_negative_log_likelihood() -> None:
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[1, 1, 0]])
    assert losses.nll_loss(log_probs, mask).item() == pytest.approx((math.log(2) + math.log(4)) / 2)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_token_log_probs_apply_the_temperature(temperature: float) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 11, generator=generator)
    targets = torch.randint(0, 11, (2, 3), generator=generator)
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(losses.token_log_probs(logits, targets, temperature), expected)


def test_temperature_zero_means_greedy_sampling_so_log_probs_are_at_temperature_one() -> None:
    logits = torch.randn(1, 4, 7, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([[0, 3, 6, 1]])
    assert torch.equal(losses.token_log_probs(logits, targets, 0.0), losses.token_log_probs(logits, targets, 1.0))


def test_entropy() -> None:
    vocab = 13
    assert torch.allclose(losses.entropy(torch.full((2, 3, vocab), 4.2)), torch.full((2, 3), math.log(vocab)))
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert losses.entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.tensor([[[1.0, 2.0, 0.5]]])
    p = torch.softmax(logits / 0.5, dim=-1)
    assert losses.entropy(logits, 0.5).item() == pytest.approx(float(-(p * p.log()).sum()))


# -- decoupled PPO with truncated importance sampling (async training's off-policy rows) ----------
# (log p, log p_prox, log p_behav, advantage, is_cap) -> (loss, weight, capped); clip 0.2/0.2.
# r = exp(log p - log p_prox); w = min(exp(log p_prox - log p_behav), cap); loss = w * max(-A r, -A clip(r)).
@pytest.mark.parametrize(
    ("lp", "prox", "behav", "adv", "cap", "loss", "weight", "capped"),
    [
        # on-policy (prox = behav): w = 1, the clipped loss itself: r = e^0.1 = 1.10517, unclipped
        (0.1, 0.0, 0.0, 1.0, 2.0, -math.exp(0.1), 1.0, 0.0),
        # w = e^0.5 = 1.64872 under the cap; r = 1: loss -A w
        (-1.0, -1.0, -1.5, 2.0, 2.0, -2.0 * math.exp(0.5), math.exp(0.5), 0.0),
        # w = e^1 = 2.718 truncated to the cap 2; r = e^0.3 > 1.2 with A > 0: clipped to 1.2
        (0.3, 0.0, -1.0, 1.0, 2.0, -2.0 * 1.2, 2.0, 1.0),
        # cap 0: no truncation, w = e^1
        (0.0, 0.0, -1.0, -1.0, 0.0, math.exp(1.0), math.exp(1.0), 0.0),
        # w < 1 (the behaviour policy liked the token more than the proximal one): no cap needed
        (0.0, -1.0, 0.0, 1.0, 2.0, -math.exp(-1.0) * 1.2, math.exp(-1.0), 0.0),
    ],
)
def test_decoupled_policy_loss_by_hand(
    lp: float, prox: float, behav: float, adv: float, cap: float, loss: float, weight: float, capped: float
) -> None:
    t = lambda v: torch.tensor([[v]])  # noqa: E731
    got, _, approx_kl, w, c = losses.decoupled_policy_loss(t(lp), t(prox), t(behav), t(adv), 0.2, 0.2, cap)
    assert float(got) == pytest.approx(loss, rel=1e-5)
    assert float(w) == pytest.approx(weight, rel=1e-5)
    assert float(c) == capped
    assert float(approx_kl) == pytest.approx(prox - lp)  # k1 to the proximal policy


def test_decoupled_loss_with_equal_proximal_and_behaviour_is_the_clipped_loss_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(4, 6, generator=gen) for _ in range(3))
    plain, clipped, kl = losses.clipped_policy_loss(lp, old, adv, 0.2, 0.28)
    got, clipped2, kl2, w, capped = losses.decoupled_policy_loss(lp, old, old, adv, 0.2, 0.28, 2.0)
    assert torch.equal(got, plain) and torch.equal(clipped, clipped2) and torch.equal(kl, kl2)
    assert torch.equal(w, torch.ones_like(w)) and not capped.any()


def test_the_importance_weight_carries_no_gradient() -> None:
    lp = torch.tensor([[0.1]], requires_grad=True)
    prox = torch.tensor([[0.0]], requires_grad=True)
    loss, *_ = losses.decoupled_policy_loss(lp, prox, torch.tensor([[-0.5]]), torch.tensor([[1.0]]), 0.2, 0.2, 2.0)
    loss.sum().backward()
    # d/d lp of -A w r = -w e^(lp - prox) with w = e^0.5 a constant
    assert float(lp.grad) == pytest.approx(-math.exp(0.5) * math.exp(0.1), rel=1e-5)


# (log p, advantage) -> the gradients by hand with w = e^0.5 (prox 0, behav -0.5) a constant: inside
# the clip range d/d lp = -A w r and d/d prox = +A w r (r = e^(lp - prox)); ratio clipped: both 0
@pytest.mark.parametrize(
    ("lp", "adv", "d_lp", "d_prox"),
    [
        (0.1, 1.0, -math.exp(0.5) * math.exp(0.1), math.exp(0.5) * math.exp(0.1)),
        (-0.1, -2.0, 2.0 * math.exp(0.5) * math.exp(-0.1), -2.0 * math.exp(0.5) * math.exp(-0.1)),
        (0.3, 1.0, 0.0, 0.0),  # r = e^0.3 > 1.2 with A > 0: the clipped term, flat in the ratio
    ],
    ids=["inside_the_range", "inside_the_range_negative_advantage", "ratio_clipped"],
)
def test_the_proximal_log_probs_get_gradient_only_through_the_ratio_and_the_behaviour_ones_none(
    lp: float, adv: float, d_lp: float, d_prox: float
) -> None:
    """With every input requiring grad, the weight min(p_prox / p_behav, cap) is a constant: the
    proximal log-probs get only the ratio's gradient (a weight carrying gradient would add -A r w
    and cancel it inside the clip range, or leave A clip(r) w where the ratio is clipped), and the
    behaviour log-probs, which enter only the weight, get none."""
    lp_ = torch.tensor([[lp]], requires_grad=True)
    prox = torch.tensor([[0.0]], requires_grad=True)
    behav = torch.tensor([[-0.5]], requires_grad=True)
    loss, *_ = losses.decoupled_policy_loss(lp_, prox, behav, torch.tensor([[adv]]), 0.2, 0.2, 2.0)
    loss.sum().backward()
    assert float(lp_.grad) == pytest.approx(d_lp, rel=1e-5, abs=1e-7)
    assert float(prox.grad) == pytest.approx(d_prox, rel=1e-5, abs=1e-7)
    assert behav.grad is None
