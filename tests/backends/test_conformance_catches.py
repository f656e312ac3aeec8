"""The conformance suite can fail: each classic backend bug, patched into the embedded backend,
fails at least one of its tests (a suite that passes a broken backend proves nothing)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from alight.backends import embedded, losses
from alight.backends.base import Backend
from alight.backends.factory import make_backend
from alight.config.schema import AlgorithmConfig, ExperimentConfig, TrainerConfig
from tests.backends import test_conformance as suite

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def make(tiny_dir: Path) -> Iterator[Callable[..., Backend]]:
    made: list[Backend] = []

    def build(model_dir: Path = tiny_dir, **algorithm: Any) -> Backend:
        algorithm.setdefault("lr", 1e-3)
        cfg = ExperimentConfig(algorithm=AlgorithmConfig(**algorithm), trainer=TrainerConfig(seed=0))
        made.append(make_backend(cfg, model_dir))
        return made[-1]

    yield build
    for backend in made:
        backend.close()


def _shifted_log_probs(
    self: Any, batch: Any, model: Any = None, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_probs with the logits one position late: each token scored by the logits that follow it."""
    batch = batch.to(self.device)
    out = (model or self.model)(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.response_length + 1,
        use_cache=False,
    )
    logits = out.logits[:, 1:]
    lp, ent = losses.log_probs_and_entropy(logits, batch.responses, self.temperature)
    return lp, ent if entropy else None


def test_log_probs_off_by_one_position_fail(make: Any, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.EmbeddedBackend, "log_probs", _shifted_log_probs)
    with pytest.raises(AssertionError):
        suite.test_log_probs_equal_an_independent_forward_pass_so_on_policy_grpo_has_ratio_one(make, tiny_dir)


def test_an_entropy_bonus_with_the_wrong_sign_fails(
    make: Any, peaked_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = losses.log_probs_and_entropy

    def wrong_sign(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> Any:
        lp, ent = both(logits, targets, temperature)
        return lp, -ent

    monkeypatch.setattr(losses, "log_probs_and_entropy", wrong_sign)
    with pytest.raises(AssertionError):
        suite.test_the_entropy_bonus_raises_the_entropy(make, peaked_dir)


def test_a_kl_penalty_with_the_wrong_sign_fails(make: Any, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kl = losses.kl_penalty
    monkeypatch.setattr(losses, "kl_penalty", lambda lp, ref, estimator="low_var_kl": -kl(lp, ref, estimator))
    with pytest.raises(AssertionError):
        suite.test_the_kl_penalty_pulls_the_policy_back_to_the_reference(make, tiny_dir, "low_var_kl")


peaked_dir = suite.peaked_dir
