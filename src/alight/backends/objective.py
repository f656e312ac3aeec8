"""What an update minimises, from the config: `algorithm.loss` (and, for `auto`, the algorithm)
feeding one pure function, so no backend branches on the algorithm's name."""

from __future__ import annotations

from dataclasses import dataclass

from alight.config.schema import AlgorithmConfig

#: algorithm.loss: auto (nll for sft, else policy) | policy (the clipped policy-gradient loss of
#: GRPO/PPO) | nll (negative log-likelihood of the responses rewarded at least sft_min_reward).
LOSSES = ("auto", "policy", "nll")


@dataclass(frozen=True)
class Objective:
    """The loss an RL batch is trained with, the passes over each batch, and (nll) the reward a
    transition needs to be learnt."""

    loss: str
    epochs: int
    min_reward: float


def objective(algorithm: AlgorithmConfig) -> Objective:
    """The `Objective` of an (already checked) algorithm config."""
    loss = algorithm.loss
    if loss == "auto":
        loss = "nll" if algorithm.name == "sft" else "policy"
    epochs = algorithm.ppo_epochs if algorithm.name == "ppo" else algorithm.epochs
    return Objective(loss=loss, epochs=epochs, min_reward=algorithm.sft_min_reward)
