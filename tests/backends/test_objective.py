"""`algorithm.loss` chooses what an update minimises through one pure function (no backend branches
on the algorithm's name): auto is nll for sft and the policy loss otherwise; ppo's passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.backends.checks import check_algorithm
from alight.backends.objective import Objective, objective
from alight.config.schema import AlgorithmConfig
from alight.errors import ConfigError


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"name": "grpo"}, Objective("policy", 1, 1.0)),
        ({"name": "grpo", "epochs": 2}, Objective("policy", 2, 1.0)),
        ({"name": "ppo", "ppo_epochs": 3}, Objective("policy", 3, 1.0)),
        ({"name": "sft", "sft_min_reward": 0.5}, Objective("nll", 1, 0.5)),
        ({"name": "grpo", "loss": "nll"}, Objective("nll", 1, 1.0)),
        ({"name": "sft", "loss": "policy"}, Objective("policy", 1, 1.0)),
        ({"name": "apo"}, Objective("policy", 1, 1.0)),
    ],
)
def test_the_objective_is_a_pure_function_of_the_config(settings: dict[str, object], expected: Objective) -> None:
    assert objective(AlgorithmConfig(**settings)) == expected  # type: ignore[arg-type]


def test_an_unknown_loss_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.loss must be one of auto, policy, nll, got 'mse'"):
        check_algorithm(AlgorithmConfig(loss="mse"))


def test_the_embedded_backend_trains_what_the_loss_field_says(tiny_dir: Path) -> None:
    """grpo with loss nll trains like sft (rewarded rows only): the backend reads the objective,
    not the name."""
    from tests.backends.test_embedded_backend import backend, batch_of, transitions

    rows = transitions([0.0] * 4, rewards=[1.0, 0.0, 2.0, 0.5])
    metrics = backend(tiny_dir, name="grpo", loss="nll").update(batch_of(rows))
    assert metrics["actor/sft_rows"] == 2.0
    assert "actor/sft_rows" not in backend(tiny_dir, name="sft", loss="policy").update(batch_of(rows))
