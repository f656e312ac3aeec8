"""Advantages by one of verl's estimators, for a user who names one (`verl.algorithm.adv_estimator`)
or PPO's critic (GAE); otherwise `VerlBackend` trains on LightningRL's advantages as given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from verl import DataProto


def verl_advantages(data: DataProto, estimator: str, verl_config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [B, R] of `data` by verl's `core_algos` estimator `estimator`, with the
    settings of `verl_config.algorithm` (GAE reads the critic's `values` in `data`)."""
    from verl.trainer.ppo import core_algos

    algorithm = verl_config.algorithm
    rewards, mask = data.batch["token_level_rewards"], data.batch["response_mask"]
    if estimator == "gae":
        result: tuple[torch.Tensor, torch.Tensor] = core_algos.compute_gae_advantage_return(
            token_level_rewards=rewards,
            values=data.batch["values"],
            response_mask=mask,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
        )
        return result
    kwargs: dict[str, Any] = {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": data.non_tensor_batch["uid"],
        "config": algorithm,
    }
    if estimator == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = algorithm.get("norm_adv_by_std_in_grpo", True)
    estimator_fn = core_algos.get_adv_estimator_fn(estimator)  # type: ignore[no-untyped-call]
    result = estimator_fn(**kwargs)
    return result
