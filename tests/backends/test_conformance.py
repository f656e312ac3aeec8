"""The backend conformance suite: what every `Backend` promises, checked through the protocol only.

Each backend is built by `make_backend` from an `ExperimentConfig`, as the training loop builds it,
and judged by what it hands the engine (`engine_weights()`) and the metrics of `update`. The
reference numbers come from an independent forward pass: a fresh Hugging Face model loaded with
those weights, fed each row's real tokens alone (no padding, no batch layout), log-softmax by hand.
So a backend whose log-probs are off by one position, whose entropy bonus or KL penalty has the
wrong sign, or whose on-policy ratio is not 1 fails here, whatever its own unit tests say.

`embedded` runs on CPU (and on CUDA when there is one); `verl` runs verl's real FSDP workers on CPU
(`verl.trainer.device: cpu`, float32) with `alight[verl]`, and `verl-cuda` needs a GPU too; each is
skipped cleanly without what it needs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.base import Backend
from alight.backends.factory import make_backend
from alight.config.schema import AlgorithmConfig, ExperimentConfig, TrainerConfig
from alight.types import Transition

PAD = 0


def _cuda() -> bool:
    return torch.cuda.is_available()


def _verl_installed() -> bool:
    return all(importlib.util.find_spec(m) for m in ("verl", "ray", "tensordict"))


def _verl_ready() -> bool:
    return _cuda() and _verl_installed() and importlib.util.find_spec("vllm") is not None


BACKENDS = [
    pytest.param(("embedded", "cpu"), id="embedded-cpu"),
    pytest.param(
        ("embedded", "cuda"),
        id="embedded-cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")],
    ),
    pytest.param(
        ("verl", "cpu"),
        id="verl",
        marks=[pytest.mark.slow, pytest.mark.skipif(not _verl_installed(), reason='needs pip install "alight[verl]"')],
    ),
    pytest.param(
        ("verl", "cuda"),
        id="verl-cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.slow,
            pytest.mark.skipif(not _verl_ready(), reason='needs a CUDA GPU and pip install "alight[verl]"'),
        ],
    ),
]

Make = Callable[..., Backend]


@pytest.fixture(params=BACKENDS)
def make(
    request: pytest.FixtureRequest, tiny_dir: Path, tmp_path: Path, one_torch_thread: None
) -> Any:  # yields a Make
    name, device = request.param
    made: list[Backend] = []
    verl: dict[str, Any] = {}
    if name == "verl" and device == "cpu":  # verl's workers on CPU: float32 FSDP, no torch.compile
        request.getfixturevalue("verl_ray")
        verl = {"trainer": {"device": "cpu"}}

    def build(model_dir: Path = tiny_dir, **algorithm: Any) -> Backend:
        algorithm.setdefault("lr", 1e-3)
        cfg = ExperimentConfig(
            algorithm=AlgorithmConfig(**algorithm),
            trainer=TrainerConfig(
                backend=name, device=device if name == "embedded" else "cpu", seed=0, output_dir=str(tmp_path)
            ),
            verl=verl,
        )
        backend = make_backend(cfg, model_dir)
        made.append(backend)
        return backend

    yield build
    for backend in made:
        backend.close()


# -- the independent reference ---------------------------------------------------------------------


def load_policy(tiny_dir: Path, weights: Mapping[str, Any] | str) -> Any:
    """A fresh float32 CPU model holding `weights` (a state dict, or a model directory)."""
    from transformers import AutoModelForCausalLM

    from alight.engines.weights import load_weights_into

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    load_weights_into(model, weights)
    return model


def response_distributions(model: Any, row: Transition) -> torch.Tensor:
    """[R, V] log-probabilities of each response position, from the row's real tokens alone."""
    ids = torch.tensor([list(row.prompt_ids) + list(row.response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n_prompt = len(row.prompt_ids)
    # the token at position t is predicted by the logits at t - 1
    return torch.log_softmax(logits[n_prompt - 1 : -1], dim=-1)


def token_log_probs(model: Any, row: Transition) -> list[float]:
    dist = response_distributions(model, row)
    return dist.gather(-1, torch.tensor(list(row.response_ids))[:, None]).squeeze(-1).tolist()


def mean_entropy(model: Any, rows: list[Transition]) -> float:
    values = [float(-(d.exp() * d).sum(-1).mean()) for d in (response_distributions(model, r) for r in rows)]
    return sum(values) / len(values)


def mean_k3(model: Any, reference: Any, rows: list[Transition]) -> float:
    """The low-variance KL estimate of KL(policy || reference) on the rows' response tokens."""
    total, count = 0.0, 0
    for row in rows:
        diff = torch.tensor(token_log_probs(reference, row)) - torch.tensor(token_log_probs(model, row))
        total += float((diff.exp() - diff - 1).sum())
        count += diff.numel()
    return total / count


def rows(advantages: list[float], seed: int = 0, logprobs: list[list[float]] | None = None) -> list[Transition]:
    """Transitions of different prompt and response lengths (padding matters), one group."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, advantage in enumerate(advantages):
        prompt = torch.randint(1, 250, (4 + 3 * i % 5,), generator=generator).tolist()
        response = torch.randint(1, 250, (3 + 2 * i % 4,), generator=generator).tolist()
        out.append(
            Transition.unchecked(
                prompt,
                response,
                1.0,
                f"ro-{i}",
                group_id="g",
                advantage=advantage,
                response_logprobs=None if logprobs is None else logprobs[i],
            )
        )
    return out


def on_policy(model: Any, advantages: list[float], seed: int = 0) -> list[Transition]:
    """Rows whose recorded log-probs are the independent model's: what an engine serving it records."""
    plain = rows(advantages, seed)
    return rows(advantages, seed, [token_log_probs(model, r) for r in plain])


def batch(transitions: list[Transition]) -> TransitionBatch:
    return TransitionBatch.from_transitions(transitions, PAD)


# -- the suite ---------------------------------------------------------------------------------------


def test_log_probs_equal_an_independent_forward_pass_so_on_policy_grpo_has_ratio_one(
    make: Make, tiny_dir: Path
) -> None:
    backend = make()
    start = load_policy(tiny_dir, backend.engine_weights())
    metrics = backend.update(batch(on_policy(start, [1.0, -1.0, 0.5, -0.5, 1.0])))
    # ratio = exp(log p_backend - log p_engine) is 1 on every token only if the backend's log-probs
    # are the independent pass's: shifted logits, a wrong mask or temperature all move it
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert abs(metrics["actor/ppo_kl"]) < 1e-5


def test_rows_without_recorded_log_probs_are_scored_on_policy(make: Make, tiny_dir: Path) -> None:
    """A row the engine recorded no log-probs for gets the backend's: the update is still on-policy."""
    backend = make()
    metrics = backend.update(batch(rows([1.0, -1.0, 0.5])))
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert abs(metrics["actor/ppo_kl"]) < 1e-5


def test_a_positive_advantage_makes_the_response_more_likely(make: Make, tiny_dir: Path) -> None:
    backend = make(lr=1e-2)
    start = load_policy(tiny_dir, backend.engine_weights())
    good, bad = on_policy(start, [1.0, -1.0])
    backend.update(batch([good, bad]))
    after = load_policy(tiny_dir, backend.engine_weights())
    assert sum(token_log_probs(after, good)) > sum(token_log_probs(start, good))
    assert sum(token_log_probs(after, bad)) < sum(token_log_probs(start, bad))


@pytest.fixture(scope="module")
def peaked_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its logits scaled up 8x: far from uniform, so entropy has room to grow
    (the freshly initialised model is already near the maximum, log V)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    path = tmp_path_factory.mktemp("peaked")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(path)
    return path


def test_the_entropy_bonus_raises_the_entropy(make: Make, peaked_dir: Path) -> None:
    backend = make(peaked_dir, lr=1e-3, entropy_coef=1.0)
    tiny_dir = peaked_dir
    start = load_policy(tiny_dir, backend.engine_weights())
    transitions = on_policy(start, [0.0, 0.0, 0.0, 0.0])  # no policy gradient: the bonus alone moves it
    metrics = backend.update(batch(transitions))
    assert metrics["actor/loss"] < 0.0  # the loss is -coef * entropy
    for _ in range(2):
        backend.update(batch(transitions))
    after = load_policy(tiny_dir, backend.engine_weights())
    assert mean_entropy(after, transitions) > mean_entropy(start, transitions) + 1e-4


@pytest.mark.parametrize("estimator", ["low_var_kl", "mse"])
def test_the_kl_penalty_pulls_the_policy_back_to_the_reference(make: Make, tiny_dir: Path, estimator: str) -> None:
    backend = make(lr=2e-2, kl_coef=1.0, kl_estimator=estimator)
    reference = load_policy(tiny_dir, backend.engine_weights())
    pushed = on_policy(reference, [1.0, -1.0, 1.0, -1.0])
    for _ in range(3):  # move the policy away from the reference
        backend.update(batch(pushed))
    moved = load_policy(tiny_dir, backend.engine_weights())
    kl_moved = mean_k3(moved, reference, pushed)
    assert kl_moved > 1e-4
    still = on_policy(moved, [0.0, 0.0, 0.0, 0.0])  # no policy gradient: the penalty alone moves it
    metrics = backend.update(batch(still))
    assert metrics["actor/loss"] > 0.0  # the loss is +coef * KL
    assert metrics["actor/kl"] > 0.0
    for _ in range(2):
        backend.update(batch(still))
    back = load_policy(tiny_dir, backend.engine_weights())
    assert mean_k3(back, reference, pushed) < kl_moved


def test_zero_advantages_without_penalties_leave_the_served_weights_unchanged(make: Make, tiny_dir: Path) -> None:
    backend = make(lr=1e-2)
    before = {k: v.clone() for k, v in load_policy(tiny_dir, backend.engine_weights()).state_dict().items()}
    backend.update(batch(rows([0.0, 0.0, 0.0])))
    after = load_policy(tiny_dir, backend.engine_weights()).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_save_then_load_serves_the_same_weights(make: Make, tiny_dir: Path, tmp_path: Path) -> None:
    backend = make(lr=1e-2)
    backend.update(batch(rows([1.0, -1.0])))
    backend.save(tmp_path / "ckpt")
    saved = load_policy(tiny_dir, str(tmp_path / "ckpt"))  # the checkpoint is a servable model directory
    fresh = make(lr=1e-2)
    fresh.load(tmp_path / "ckpt")
    loaded = load_policy(tiny_dir, fresh.engine_weights())
    for key, value in saved.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    # the optimizer came back too: the same next update gives the same weights
    again = rows([1.0, -1.0], seed=3)
    backend.update(batch(again))
    fresh.update(batch(again))
    one, two = load_policy(tiny_dir, backend.engine_weights()), load_policy(tiny_dir, fresh.engine_weights())
    assert all(torch.allclose(v, two.state_dict()[k], atol=1e-6) for k, v in one.state_dict().items())


def test_the_protocol_is_complete(make: Make) -> None:
    backend = make()
    assert isinstance(backend, Backend)
    assert isinstance(backend.colocated, bool)
    assert backend.max_length is None or backend.max_length > 0
