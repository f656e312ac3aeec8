"""The embedded backend trains the real tiny model on CPU: what each update promises."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.checks import check_algorithm
from alight.backends.embedded import EmbeddedBackend
from alight.config.schema import AlgorithmConfig, LoraConfig
from alight.errors import ConfigError
from alight.types import Transition

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAD = 0


def transitions(
    advantages: list[float],
    *,
    rewards: list[float] | None = None,
    logprobs: list[list[float] | None] | None = None,
    seed: int = 0,
) -> list[Transition]:
    """One transition per advantage, prompts and responses of different lengths (so padding matters)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, advantage in enumerate(advantages):
        prompt = torch.randint(1, 250, (3 + 2 * i % 5,), generator=generator).tolist()
        response = torch.randint(1, 250, (2 + 3 * i % 4,), generator=generator).tolist()
        out.append(
            Transition.unchecked(
                prompt,
                response,
                1.0 if rewards is None else rewards[i],
                f"ro-{i}",
                group_id="g",
                advantage=advantage,
                response_logprobs=None if logprobs is None else logprobs[i],
            )
        )
    return out


def batch_of(rows: list[Transition]) -> TransitionBatch:
    return TransitionBatch.from_transitions(rows, PAD)


def backend(tiny_dir: Path, **algorithm: Any) -> EmbeddedBackend:
    algorithm.setdefault("lr", 1e-3)
    return EmbeddedBackend(tiny_dir, AlgorithmConfig(**algorithm), seed=0)


def weights(b: EmbeddedBackend) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in b.model.state_dict().items()}


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in before if not torch.equal(before[k], after[k])]


def on_policy_logprobs(b: EmbeddedBackend, rows: list[Transition]) -> list[list[float]]:
    """Each row's response log-probs under the backend's current policy (what the engine would record)."""
    with torch.no_grad():
        out = []
        for row in rows:
            lp = b.log_probs(batch_of([row]))[0][0]
            out.append(lp.tolist())
        return out


def response_log_prob(b: EmbeddedBackend, rows: list[Transition]) -> float:
    """Summed log-probability of every row's response under the policy."""
    batch = batch_of(rows)
    with torch.no_grad():
        return float((b.log_probs(batch)[0] * batch.response_mask).sum())


def test_an_update_moves_the_weights_and_engine_weights_are_a_cpu_copy(tiny_dir: Path) -> None:
    b = backend(tiny_dir)
    before = weights(b)
    metrics = b.update(batch_of(transitions([1.0, -1.0, 0.5])))
    assert changed(before, weights(b))
    assert metrics["actor/optimizer_steps"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())
    served = b.engine_weights()
    assert list(served) == list(b.model.state_dict())
    assert all(v.device.type == "cpu" for v in served.values())
    key = "model.embed_tokens.weight"
    served[key].add_(1.0)  # a copy: the engine may keep it while training goes on
    assert not torch.equal(served[key], b.model.state_dict()[key])


def forward_counter(b: EmbeddedBackend) -> list[int]:
    """Counts the policy's decoder forward passes."""
    calls: list[int] = []
    b.model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_zero_advantages_run_no_forward_and_no_optimizer_step(tiny_dir: Path, name: str) -> None:
    # weight decay and warm-up: a step with a zero gradient would still move the weights and the lr
    b = backend(tiny_dir, name=name, weight_decay=0.1, warmup_steps=5, micro_batch_size=2, mini_batch_size=2)
    calls = forward_counter(b)
    before, lr = weights(b), b.optimization.scheduler.get_last_lr()[0]
    metrics = b.update(batch_of(transitions([0.0, 0.0, 0.0])))
    assert changed(before, weights(b)) == []
    assert calls == []
    assert not b.optimization.optimizer.state  # AdamW never stepped
    assert b.optimization.scheduler.get_last_lr()[0] == lr  # warm-up counts real updates only
    epochs = 4 if name == "ppo" else 1
    assert metrics["actor/optimizer_steps"] == 0.0
    assert metrics["actor/skipped_steps"] == epochs * 2  # mini-batches of 2, 1
    assert metrics["actor/skipped_micro_batches"] == epochs * 2


def test_only_micro_batches_with_a_gradient_run_and_the_step_is_unchanged(tiny_dir: Path) -> None:
    advantages = [0.0, 0.0, 1.0, -0.5, 0.0]  # micro-batches of 2: [0, 0] skipped, [1, -0.5], [0] skipped
    recorded = [[-2.0] * len(row.response_ids) for row in transitions(advantages)]  # no forward to fill them
    rows = transitions(advantages, logprobs=recorded)  # type: ignore[arg-type]
    results = []
    for micro in (2, len(rows)):  # all rows in one micro-batch: nothing can be skipped
        b = backend(tiny_dir, micro_batch_size=micro, weight_decay=0.1)
        calls, grads = forward_counter(b), applied_gradients(b)
        metrics = b.update(batch_of(rows))
        results.append((len(calls), grads, weights(b), metrics))
    (calls_small, g_small, _, m_small), (calls_one, g_one, _, m_one) = results
    assert (calls_small, calls_one) == (1, 1)
    assert (m_small["actor/skipped_micro_batches"], m_one["actor/skipped_micro_batches"]) == (2.0, 0.0)
    assert m_small["actor/optimizer_steps"] == m_one["actor/optimizer_steps"] == 1.0
    for key, grad in g_one.items():  # the skipped rows' zero loss was still counted in the normaliser
        assert torch.allclose(g_small[key], grad, atol=1e-6, rtol=1e-4), key
    assert m_small["actor/loss"] == pytest.approx(m_one["actor/loss"], abs=1e-6)


@pytest.mark.parametrize("penalty", [{"kl_coef": 0.5}, {"entropy_coef": 0.1}])
def test_zero_advantages_still_step_with_a_kl_or_entropy_term(tiny_dir: Path, penalty: dict[str, float]) -> None:
    b = backend(tiny_dir, weight_decay=0.1, **penalty)
    calls = forward_counter(b)
    before = weights(b)
    metrics = b.update(batch_of(transitions([0.0, 0.0, 0.0])))
    assert metrics["actor/optimizer_steps"] == 1.0 and metrics["actor/skipped_micro_batches"] == 0.0
    assert calls and changed(before, weights(b))


def test_sft_and_the_warm_start_never_skip(tiny_dir: Path) -> None:
    b = backend(tiny_dir, name="sft", sft_min_reward=0.5)
    before = weights(b)
    metrics = b.update(batch_of(transitions([0.0, 0.0], rewards=[1.0, 1.0])))  # sft ignores advantages
    assert metrics["actor/sft_rows"] == 2.0 and changed(before, weights(b))
    before = weights(b)
    b.warm_start(iter([batch_of(transitions([0.0, 0.0]))]), steps=1, lr=1e-3, warmup_steps=0)
    assert changed(before, weights(b))


def test_on_policy_grpo_has_ratio_one(tiny_dir: Path) -> None:
    b = backend(tiny_dir)
    rows = transitions([1.0, -1.0, 0.5, -0.5])
    rows = transitions([1.0, -1.0, 0.5, -0.5], logprobs=on_policy_logprobs(b, rows))  # type: ignore[arg-type]
    metrics = b.update(batch_of(rows))
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-5)


def test_ppo_takes_epochs_times_mini_batches_steps_and_clips(tiny_dir: Path) -> None:
    b = backend(tiny_dir, name="ppo", ppo_epochs=4, mini_batch_size=2, lr=5e-2, max_grad_norm=0.0)
    batch = batch_of(transitions([1.0, -1.0, 1.0, -1.0, 1.0]))
    metrics = b.update(batch)
    assert metrics["actor/optimizer_steps"] == 4 * math.ceil(5 / 2)
    assert metrics["actor/pg_clipfrac"] > 0.0  # later epochs see ratios pushed out of [0.8, 1.2]
    assert metrics["actor/ppo_kl"] != 0.0


def test_rows_without_log_probs_get_the_policy_s(tiny_dir: Path) -> None:
    b = backend(tiny_dir)
    rows = transitions([1.0, 1.0, 1.0])
    given = [-1.0] * len(rows[1].response_ids)
    batch = batch_of(transitions([1.0, 1.0, 1.0], logprobs=[None, given, None]))
    assert batch.has_old_log_probs.tolist() == [False, True, False]
    b.fill_old_log_probs(batch)
    assert batch.has_old_log_probs.all()
    expected = on_policy_logprobs(b, rows)
    for i in (0, 2):
        n = len(rows[i].response_ids)
        assert batch.old_log_probs[i, :n].tolist() == pytest.approx(expected[i], abs=1e-5)
        assert (batch.old_log_probs[i, n:] == 0).all()  # padding stays 0
    assert batch.old_log_probs[1, : len(given)].tolist() == given  # recorded log-probs are kept


def test_stale_rows_train_against_the_proximal_policy_with_truncated_importance_weights(tiny_dir: Path) -> None:
    """Async training: rows served by older weights (their recorded log-probs 0.7 below the
    current policy's, so p_prox / p_behav = e^0.7 = 2.01) get the current policy's log-probs as
    the proximal anchor, weight min(2.01, is_cap); fresh rows keep ratio and weight 1."""
    b = backend(tiny_dir, is_cap=1.5)
    rows = transitions([1.0, -1.0, 0.5, -0.5])
    current = on_policy_logprobs(b, rows)
    behaviour = [[v - 0.7 for v in lp] for lp in current]
    batch = batch_of(transitions([1.0, -1.0, 0.5, -0.5], logprobs=behaviour))  # type: ignore[arg-type]
    batch.mark_stale({"ro-0", "ro-2"})
    assert batch.stale is not None and batch.stale.tolist() == [True, False, True, False]
    b.fill_proximal_log_probs(batch)
    assert batch.proximal_log_probs is not None
    for i in range(4):
        n = len(rows[i].response_ids)
        expected = current[i] if i in (0, 2) else behaviour[i]  # fresh rows: proximal = behaviour
        assert batch.proximal_log_probs[i, :n].tolist() == pytest.approx(expected, abs=1e-5)
    fresh_tokens = sum(len(rows[i].response_ids) for i in (1, 3))
    stale_tokens = sum(len(rows[i].response_ids) for i in (0, 2))
    fresh_batch = batch_of(transitions([1.0, -1.0, 0.5, -0.5], logprobs=behaviour))  # type: ignore[arg-type]
    fresh_batch.mark_stale({"ro-0", "ro-2"})
    metrics = backend(tiny_dir, is_cap=1.5).update(fresh_batch)  # the update fills the proximal log-probs
    # stale tokens: weight capped at 1.5 (e^0.7 > 1.5); fresh tokens: weight 1
    expected_weight = (1.5 * stale_tokens + fresh_tokens) / (stale_tokens + fresh_tokens)
    assert metrics["actor/is_weight_mean"] == pytest.approx(expected_weight, rel=1e-4)
    assert metrics["actor/is_capped_frac"] == pytest.approx(stale_tokens / (stale_tokens + fresh_tokens))
    # the same rows all fresh: the plain clipped loss against the behaviour log-probs, weight 1
    plain = batch_of(transitions([1.0, -1.0, 0.5, -0.5], logprobs=behaviour))  # type: ignore[arg-type]
    plain_metrics = backend(tiny_dir, is_cap=1.5).update(plain)
    assert plain_metrics["actor/is_weight_mean"] == 1.0 and plain_metrics["actor/is_capped_frac"] == 0.0
    assert plain_metrics["actor/pg_clipfrac"] > 0  # ratio e^0.7 to the behaviour policy is clipped
    assert metrics["actor/pg_clipfrac"] < plain_metrics["actor/pg_clipfrac"]  # stale rows: ratio 1


def count_calls(obj: Any, name: str) -> list[None]:
    """Wrap `obj.name` to append to the returned list at each call."""
    calls: list[None] = []
    method = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


@pytest.mark.parametrize("mini_batch_size", [None, 2])
def test_one_step_updates_take_the_proximal_anchor_from_their_own_forward(
    tiny_dir: Path, mini_batch_size: int | None
) -> None:
    """One optimizer step per batch: every forward runs on the weights before the step, so a stale
    row's proximal log-probs are its own (detached) log-probs: no separate forward, and the step
    applies what it applies with the anchor computed beforehand. Two steps (mini-batches of 2) need
    the anchor from before the first: one forward more."""
    rows = transitions([1.0, -1.0, 0.5, -0.5])
    behaviour = [[v - 0.7 for v in lp] for lp in on_policy_logprobs(backend(tiny_dir), rows)]

    def stale_batch() -> TransitionBatch:
        batch = batch_of(transitions([1.0, -1.0, 0.5, -0.5], logprobs=behaviour))  # type: ignore[arg-type]
        batch.mark_stale({"ro-0", "ro-2"})
        return batch

    results = []
    for anchor_first in (False, True):
        b = backend(tiny_dir, is_cap=1.5, micro_batch_size=2, mini_batch_size=mini_batch_size)
        grads = applied_gradients(b)
        calls = count_calls(b, "log_probs")
        batch = stale_batch()
        if anchor_first:
            b.fill_proximal_log_probs(batch)  # the separate forward (one micro-batch: both stale rows)
        metrics = b.update(batch)
        results.append((dict(grads), weights(b), metrics, len(calls)))
    (g_own, w_own, m_own, f_own), (g_first, w_first, m_first, f_first) = results
    assert f_own == (2 if mini_batch_size is None else 3)  # 2 micro-batches (+ the anchor for 2 steps)
    assert f_first == f_own + 1
    for key, grad in g_first.items():
        assert torch.allclose(g_own[key], grad, atol=1e-6, rtol=1e-4), key
    for key, weight in w_first.items():
        assert torch.allclose(w_own[key], weight, atol=1e-6), key
    for name in ("actor/is_weight_mean", "actor/is_capped_frac", "actor/pg_clipfrac", "actor/loss"):
        assert m_own[name] == pytest.approx(m_first[name], abs=1e-6), name


def applied_gradients(b: EmbeddedBackend) -> dict[str, torch.Tensor]:
    """Filled, at each optimizer step, with the accumulated (and clipped) gradient the optimizer applies."""
    grads: dict[str, torch.Tensor] = {}
    names = {p: n for n, p in b.model.named_parameters()}

    def keep(optimizer: Any, *_: Any) -> None:
        grads.update({names[p]: p.grad.clone() for group in optimizer.param_groups for p in group["params"]})

    b.optimization.optimizer.register_step_pre_hook(keep)
    return grads


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_micro_batching_does_not_change_the_step(tiny_dir: Path, loss_agg: str) -> None:
    rows = transitions([1.0, -0.5, 0.7, -1.2])  # different lengths: each micro-batch pads differently
    results = []
    for micro in (1, len(rows)):
        b = backend(tiny_dir, micro_batch_size=micro, loss_agg=loss_agg)
        grads = applied_gradients(b)
        metrics = b.update(batch_of(rows))
        results.append((grads, weights(b), metrics))
    (g_one, w_one, m_one), (g_full, w_full, m_full) = results
    for key, grad in g_full.items():
        assert torch.allclose(g_one[key], grad, atol=1e-6, rtol=1e-4), key
        # Adam's first step is about lr * sign(grad): compare weights where the sign is not rounding noise
        clear = grad.abs() > 1e-4
        assert torch.allclose(w_one[key][clear], w_full[key][clear], atol=1e-6), key
    assert m_one["actor/loss"] == pytest.approx(m_full["actor/loss"], abs=1e-6)
    assert m_one["actor/grad_norm"] == pytest.approx(m_full["actor/grad_norm"], rel=1e-5)


def test_a_positive_advantage_makes_the_response_more_likely(tiny_dir: Path) -> None:
    b = backend(tiny_dir)
    good, bad = transitions([1.0, -1.0])
    good_before, bad_before = response_log_prob(b, [good]), response_log_prob(b, [bad])
    for _ in range(3):
        b.update(batch_of(transitions([1.0, -1.0])))  # fresh rows: their old log-probs are the policy's now
    assert response_log_prob(b, [good]) > good_before + 0.1
    assert response_log_prob(b, [bad]) < bad_before - 0.1


def test_sft_trains_only_on_rows_with_enough_reward(tiny_dir: Path) -> None:
    rewards = [1.0, 0.0, 2.0, 0.5]
    rows = transitions([0.0] * 4, rewards=rewards)
    sft = backend(tiny_dir, name="sft", sft_min_reward=1.0)
    metrics = sft.update(batch_of(rows))
    assert metrics["actor/sft_rows"] == 2.0
    reference = backend(tiny_dir, name="sft")
    reference.supervised_step(batch_of([rows[0], rows[2]]))
    after, expected = weights(sft), weights(reference)
    for key in after:
        assert torch.allclose(after[key], expected[key], atol=1e-6), key

    none = backend(tiny_dir, name="sft", sft_min_reward=5.0)
    before = weights(none)
    assert none.update(batch_of(rows)) == {"actor/sft_rows": 0.0}
    assert changed(before, weights(none)) == []


def test_supervised_steps_lower_the_nll(tiny_dir: Path) -> None:
    b = backend(tiny_dir, lr=1e-2)
    rows = transitions([0.0, 0.0])
    before = -response_log_prob(b, rows)
    first = b.supervised_step(batch_of(rows))["actor/loss"]
    for _ in range(19):
        last = b.supervised_step(batch_of(rows))["actor/loss"]
    assert last < first / 2
    assert -response_log_prob(b, rows) < before / 2


@pytest.mark.parametrize("lora", [False, True])
def test_kl_to_the_reference_grows_once_the_policy_moves(tiny_dir: Path, lora: bool) -> None:
    extra: dict[str, Any] = {"lora": LoraConfig(enabled=True)} if lora else {}
    b = backend(tiny_dir, kl_coef=0.1, lr=2e-2, **extra)
    assert (b.reference is not None) != lora  # with LoRA the reference is the model with adapters off
    reference_before = None if b.reference is None else weights_of(b.reference)
    first = b.update(batch_of(transitions([1.0, -1.0])))
    assert first["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    for _ in range(3):
        last = b.update(batch_of(transitions([1.0, -1.0])))
    assert last["actor/kl"] > 1e-4
    if reference_before is not None:
        assert changed(reference_before, weights_of(b.reference)) == []  # the reference stays frozen


def weights_of(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lora_trains_adapters_and_serves_merged_base_weights(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    b = backend(tiny_dir, lr=1e-2, lora=LoraConfig(enabled=True, r=4))
    trainable = [name for name, p in b.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    base_keys = list(AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict())
    before = b.engine_weights()
    assert list(before) == base_keys
    model_before = weights(b)
    b.update(batch_of(transitions([1.0, -1.0, 0.5])))
    after = b.engine_weights()
    assert list(after) == base_keys
    moved = changed(before, after)
    assert moved and all(
        k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")) for k in moved
    )
    base_names = [k for k in model_before if "lora_" not in k]
    assert (
        changed({k: model_before[k] for k in base_names}, weights(b)) == []
    )  # merging for the engine left them as they were


@pytest.mark.parametrize("lora", [False, True])
def test_save_then_load_restores_weights_and_optimizer(tiny_dir: Path, tmp_path: Path, lora: bool) -> None:
    extra: dict[str, Any] = {"lora": LoraConfig(enabled=True)} if lora else {}
    original = backend(tiny_dir, warmup_steps=3, kl_coef=0.05, **extra)
    original.update(batch_of(transitions([1.0, -1.0, 0.3])))
    original.save(tmp_path / "ckpt")

    restored = backend(tiny_dir, warmup_steps=3, kl_coef=0.05, **extra)
    restored.load(tmp_path / "ckpt")
    saved = weights(original)
    for key, value in weights(restored).items():
        assert torch.equal(value, saved[key]), key
    assert restored.optimization.scheduler.get_last_lr() == original.optimization.scheduler.get_last_lr()

    rows = transitions([0.5, -1.0, 1.0], seed=1)
    m_original, m_restored = original.update(batch_of(rows)), restored.update(batch_of(rows))
    assert m_original == m_restored  # same moments, same learning-rate schedule, same reference
    after = weights(original)
    for key, value in weights(restored).items():
        assert torch.equal(value, after[key]), key


# (field, bad value)
BAD = [  # algorithm.name is checked with the rest of the run's config (tests/trainer/test_loops.py)
    ("loss", "mse"),
    ("loss_agg", "sum"),
    ("kl_estimator", "k4"),
    ("lr", 0.0),
    ("micro_batch_size", 0),
    ("micro_batch_size", "big"),
    ("micro_batch_size", True),
    ("log_prob_chunk", -1),
    ("memory_fraction", 0.0),
    ("mini_batch_size", 0),
    ("epochs", 0),
    ("ppo_epochs", 0),
    ("clip_ratio_low", 1.0),
    ("clip_ratio_low", -0.1),
    ("clip_ratio_high", -0.1),
    ("kl_coef", -0.5),
    ("max_grad_norm", -1.0),
    ("warmup_steps", -1),
    ("betas", [0.9]),
    ("betas", [0.9, 1.0]),
    ("weight_decay", -0.01),
]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_check_algorithm_names_the_bad_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"algorithm\.{field}\b"):
        check_algorithm(AlgorithmConfig(**{field: value}))


def test_check_algorithm_accepts_the_defaults_and_each_algorithm() -> None:
    for name in ("grpo", "ppo", "sft"):
        check_algorithm(AlgorithmConfig(name=name, mini_batch_size=4, clip_ratio_high=0.28))


def test_the_backend_settings_are_checked_before_any_model_loads(tmp_path: Path) -> None:
    """Once, with the run's config (`check_backend`); the backend then trusts what it is given."""
    from alight.backends.factory import check_backend
    from alight.config.schema import ExperimentConfig

    with pytest.raises(ConfigError, match=r"algorithm\.lr"):
        check_backend(ExperimentConfig(algorithm=AlgorithmConfig(lr=-1.0)))


def test_the_log_prob_gap_is_the_engines_against_the_policy_on_fresh_recorded_rows(tiny_dir: Path) -> None:
    """Row 0 recorded 0.25 off, row 1 exact, row 2 stale (1.0 off: not counted), row 3 without
    log-probs (the policy's own: not counted); measured on the weights that served them."""
    b = backend(tiny_dir)
    rows = transitions([1.0, -1.0, 0.5, -0.5])
    current = on_policy_logprobs(b, rows)
    recorded: list[list[float] | None] = [
        [v + 0.25 for v in current[0]],
        current[1],
        [v - 1.0 for v in current[2]],
        None,
    ]
    batch = batch_of(transitions([1.0, -1.0, 0.5, -0.5], logprobs=recorded))
    batch.mark_stale({"ro-2"})
    metrics = b.update(batch)
    n0, n1 = len(rows[0].response_ids), len(rows[1].response_ids)
    assert metrics["actor/logprob_gap_mean"] == pytest.approx(0.25 * n0 / (n0 + n1), abs=1e-4)
    assert metrics["actor/logprob_gap_max"] == pytest.approx(0.25, abs=1e-4)
    assert set(batch.meta) == set(batch_of(rows).meta)  # the update leaves the batch's metadata as it was
