"""Fixtures for the verl backend's CPU tests: real TransitionBatches and experiment configs.

Nothing here imports verl; each test module skips itself without it (`pytest.importorskip`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from alight.algorithms.batch import TransitionBatch
from alight.config.schema import ExperimentConfig
from alight.types import Transition

PAD = 0


def mixed_transitions(seed: int = 0) -> list[Transition]:
    """Six rows that exercise every layout: prompts and responses of different lengths, two GRPO
    groups and a row without one, a trajectory row whose response masks inserted tokens (its last
    response token included), a row without log-probs, rewards and advantages all different."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    shapes = [(3, 5), (7, 2), (1, 6), (4, 1), (6, 4), (2, 7)]
    groups = ["g0", "g0", "g1", "g1", None, "g0"]
    rows = []
    for i, ((p, r), group) in enumerate(zip(shapes, groups, strict=True)):
        prompt = torch.randint(1, 250, (p,), generator=generator).tolist()
        response = torch.randint(1, 250, (r,), generator=generator).tolist()
        logprobs = None if i == 3 else (-torch.rand(r, generator=generator)).tolist()
        mask = [1, 1, 0, 0, 1, 1, 0] if i == 5 else None
        rows.append(
            Transition.unchecked(
                prompt,
                response,
                0.5 * i - 1.0,
                f"ro-{i}",
                attempt_id=f"at-{i}",
                group_id=group,
                step_index=i % 3,
                agent_name="agent",
                advantage=0.25 * i - 0.6,
                response_logprobs=logprobs,
                response_mask=mask,
            )
        )
    return rows


@pytest.fixture
def batch() -> TransitionBatch:
    """The six `mixed_transitions` rows as one batch."""
    return TransitionBatch.from_transitions(mixed_transitions(), PAD)


@pytest.fixture
def experiment() -> Callable[..., ExperimentConfig]:
    """An `ExperimentConfig` with some fields set: experiment(algorithm={...}, trainer={...}, verl={...})."""

    def make(**sections: Any) -> ExperimentConfig:
        cfg = ExperimentConfig(name="verl-test")
        for section, values in sections.items():
            if section == "verl":
                cfg.verl = values
                continue
            target = getattr(cfg, section)
            for key, value in values.items():
                setattr(target, key, value)
        return cfg

    return make
