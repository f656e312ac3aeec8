"""What `trainer.backend: verl` refuses before anything starts, each as a one-line `ConfigError`."""

from __future__ import annotations

import importlib.util
import os

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

#: Top-level modules the backend imports; without any of them, choosing it is a one-line error.
NEEDS = ("verl", "ray", "tensordict")
INSTALL = 'pip install "alight[verl]"'

NO_WARM_START = "trainer.backend verl has no warm start (it trains pretrained models): set warm_start.steps=0"


def check_verl_backend(cfg: ExperimentConfig) -> None:
    """Per-agent LoRA, a missing extra, `algorithm.name: sft`, a loss other than the policy loss, a
    warm start, or no CUDA (unless `RAY_ADDRESS` names a cluster or verl runs on the CPU)."""
    if cfg.algorithm.lora.per_agent:
        raise ConfigError(
            "algorithm.lora.per_agent: not yet with trainer.backend=verl "
            "(the embedded backend and engine only; the verl/vLLM path (GPUs) is not built yet)"
        )
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"trainer.backend verl needs {', '.join(missing)}: {INSTALL}")
    if cfg.algorithm.name not in ("grpo", "ppo"):
        raise ConfigError(
            f"trainer.backend verl trains algorithm.name grpo or ppo, not {cfg.algorithm.name!r} "
            "(sft runs on trainer.backend=embedded)"
        )
    if cfg.algorithm.loss not in ("auto", "policy"):
        raise ConfigError(f"trainer.backend verl trains with algorithm.loss policy, not {cfg.algorithm.loss!r}")
    if cfg.warm_start.steps > 0:
        raise ConfigError(NO_WARM_START)
    if cfg.algorithm.precision == "bf16":  # fp32 (the default) and auto leave verl's own settings
        raise ConfigError(
            "algorithm.precision=bf16 is the embedded backend's; verl sets its own in the verl: block "
            "(actor_rollout_ref.actor.fsdp_config.mixed_precision)"
        )
    from alight.backends.verl.config import CPU, verl_device

    if verl_device(cfg) == CPU:  # verl's workers on this machine's CPUs (cpu_platform)
        return
    import torch

    if not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError(
            "trainer.backend verl needs CUDA GPUs (verl's FSDP workers run on CUDA) and this machine has "
            "none; set RAY_ADDRESS to a GPU Ray cluster, verl.trainer.device=cpu, or trainer.backend=embedded"
        )
