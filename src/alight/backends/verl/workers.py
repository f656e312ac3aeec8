"""verl's worker groups on Ray for `VerlBackend` (imported only when the verl backend starts).

The workers are verl 0.9.1's model-engine workers, the ones its own trainers (`main_ppo`'s v1
trainer and the legacy `RayPPOTrainer`) create: `engine_workers.ActorRolloutRefWorker` with role
`actor` (no rollout engine: alight's vLLM does rollouts) and role `ref` for the frozen reference,
and `engine_workers.TrainingWorker` with a value model for the critic. All roles share one Ray
actor per GPU (`create_colocated_worker_cls`, as verl colocates them), over a resource pool of
`trainer.nnodes` x `trainer.n_gpus_per_node` GPUs. `ActorWorker` adds one method to verl's actor:
`save_hf_model`, the full weights gathered from the FSDP shards (LoRA merged) written by rank 0
as a servable Hugging Face directory.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from alight.backends.verl.config import CPU, CPU_WORKER_ENV, critic_config
from alight.errors import ConfigError

logger = logging.getLogger(__name__)


class ActorWorker(ActorRolloutRefWorker):  # type: ignore[misc]
    """verl's actor/reference worker plus `save_hf_model` (runs inside a Ray actor, one per GPU)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, no-untyped-call, attr-defined]
    def save_hf_model(self, path: str, base_dir: str | None = None) -> None:
        """Every rank takes part in gathering each full tensor; rank 0 writes the directory."""
        import torch

        from alight.backends.verl.servable import write_hf_model

        assert self.actor is not None, "save_hf_model needs the actor role"
        engine: Any = self.actor.engine
        params, peft_config = engine.get_per_tensor_param()
        if peft_config is not None:  # adapters only: vLLM would need the base weights separately
            raise RuntimeError("LoRA export needs merged weights: set actor_rollout_ref.model.lora.merge=true")
        rank0 = torch.distributed.get_rank() == 0
        state = {}
        for name, tensor in params:
            if rank0:
                state[name] = tensor.detach().to("cpu", copy=True)
        if rank0:
            base = Path(base_dir) if base_dir else None
            write_hf_model(state, engine.model_config.hf_config, Path(path), base_dir=base)
        torch.distributed.barrier()


def load_value_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
    """verl's `load_valuehead_model` with the attention the model config names (alight's choice:
    flash_attention_2 only where flash-attn is installed, else sdpa); verl's own hard-codes
    flash_attention_2, so a critic fails to load without flash-attn. A model with no
    token-classification head falls back to verl's loader (trl's value head)."""
    from transformers import AutoModelForTokenClassification

    attention = getattr(model_config, "_attn_implementation", None) or "sdpa"
    try:
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=attention,
            trust_remote_code=trust_remote_code,
        )
    except ValueError:  # no token-classification class for this architecture
        return VERL_VALUE_LOADER[0](local_path, torch_dtype, model_config, trust_remote_code)


def honour_attention_in_value_models() -> None:
    """Have verl's FSDP engines load value models through `load_value_model` (idempotent)."""
    from verl.utils import model as verl_model

    if verl_model.load_valuehead_model is not load_value_model:
        VERL_VALUE_LOADER[:] = [verl_model.load_valuehead_model]
        verl_model.load_valuehead_model = load_value_model


#: verl's own `load_valuehead_model`, kept for architectures without a token-classification head.
VERL_VALUE_LOADER: list[Callable[..., Any]] = []


class CriticWorker(TrainingWorker):  # type: ignore[misc]
    """verl's training worker for PPO's value model, loading it with alight's attention."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        honour_attention_in_value_models()
        super().__init__(*args, **kwargs)


@dataclass
class WorkerGroups:
    """The worker groups `VerlBackend` drives (verl's `RayWorkerGroup`s, or stand-ins in tests)."""

    actor: Any  # init_model, compute_log_prob, update_actor, save/load_checkpoint, save_hf_model
    ref: Any | None = None  # a separate reference (KL without LoRA): init_model, compute_ref_log_prob
    critic: Any | None = None  # PPO's value model: reset, set_loss_fn, infer_batch, train_mini_batch
    release: Callable[[], None] | None = None  # stops the workers and frees their GPUs

    def groups(self) -> list[Any]:
        return [group for group in (self.actor, self.ref, self.critic) if group is not None]

    def kill(self) -> None:
        """Stop the workers (once)."""
        release, self.release = self.release, None
        if release is not None:
            release()


def start_ray(verl_config: Any) -> bool:
    """Connect to Ray (the cluster at `RAY_ADDRESS`, else a local one) unless this process already
    is; verl's worker environment (`get_ppo_ray_runtime_env`) plus the config's `ray_kwargs.ray_init`.
    Returns True when this call started it (so closing the backend shuts it down)."""
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    if ray.is_initialized():
        return False
    ray_init = OmegaConf.to_container(OmegaConf.select(verl_config, "ray_kwargs.ray_init") or OmegaConf.create())
    assert isinstance(ray_init, dict)
    kwargs: dict[str, Any] = {str(k): v for k, v in ray_init.items() if v is not None and k != "runtime_env"}
    verl_env = get_ppo_ray_runtime_env(verl_config)  # type: ignore[no-untyped-call]
    if str(verl_config.trainer.device) == CPU:  # a worker per bundle of 1 CPU, even on fewer cores
        processes = int(verl_config.trainer.n_gpus_per_node) * int(verl_config.trainer.nnodes)
        kwargs.setdefault("num_cpus", max(os.cpu_count() or 1, processes))
    runtime_env = OmegaConf.merge(verl_env, ray_init.get("runtime_env") or {})
    address = os.environ.get("RAY_ADDRESS")
    if address:  # an existing cluster owns its resources: ray.init refuses num_cpus/num_gpus then
        kwargs = {key: value for key, value in kwargs.items() if key not in ("num_cpus", "num_gpus")}
    logger.info("starting Ray (%s)", address or "local")
    ray.init(address=address or None, runtime_env=OmegaConf.to_container(runtime_env), **kwargs)
    return True


def ray_worker_groups(verl_config: Any, *, use_ref: bool, use_critic: bool) -> WorkerGroups:
    """verl's worker groups on a Ray pool of `trainer.nnodes` x `trainer.n_gpus_per_node` GPUs
    (Ray started first when needed; killing the groups shuts down a Ray this call started)."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray.base import create_colocated_worker_cls

    on_cpu = str(verl_config.trainer.device) == CPU
    owns_ray = start_ray(verl_config)
    n_gpus, nnodes = int(verl_config.trainer.n_gpus_per_node), int(verl_config.trainer.nnodes)
    available = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call]
    if available < n_gpus * nnodes and not on_cpu:
        if owns_ray:
            ray.shutdown()
        raise ConfigError(
            f"trainer.backend verl: the Ray cluster has {available:g} GPUs, the config asks for "
            f"{nnodes} x {n_gpus} (trainer.nnodes x trainer.n_gpus_per_node)"
        )
    # on CPU: one CPU bundle per worker process (the roles share it), verl's platform named in their environment
    pool = RayResourcePool(
        process_on_nodes=[n_gpus] * nnodes,
        use_gpu=not on_cpu,
        max_colocate_count=1 if on_cpu else 3,
        name_prefix=f"alight{uuid.uuid4().hex[:8]}_",  # placement group names are cluster-wide: one per backend
    )
    roles: dict[str, Any] = {
        "actor": RayClassWithInitArgs(cls=ray.remote(ActorWorker), config=verl_config.actor_rollout_ref, role="actor")
    }
    if use_ref:
        ref = ray.remote(ActorWorker)
        roles["ref"] = RayClassWithInitArgs(cls=ref, config=verl_config.actor_rollout_ref, role="ref")
    if use_critic:
        critic = ray.remote(CriticWorker)
        roles["critic"] = RayClassWithInitArgs(cls=critic, config=critic_worker_config(verl_config))
    colocated = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=create_colocated_worker_cls(class_dict=roles),
        device_name=str(verl_config.trainer.get("device", "cuda")),
        worker_env=dict(CPU_WORKER_ENV) if on_cpu else {},
    )
    spawned = colocated.spawn(prefix_set=roles.keys())  # type: ignore[no-untyped-call]
    return WorkerGroups(
        actor=spawned["actor"],
        ref=spawned.get("ref"),
        critic=spawned.get("critic"),
        release=lambda: kill_workers([colocated, *spawned.values()], pool, shutdown=owns_ray),
    )


def critic_worker_config(verl_config: Any) -> Any:
    """The critic's `TrainingWorkerConfig`, built as verl's trainers build it (a value model)."""
    from verl.workers.config import TrainingWorkerConfig

    critic = critic_config(verl_config)
    critic.engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    critic.engine.max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
    return TrainingWorkerConfig(
        model_type="value_model",
        model_config=critic.model,
        engine_config=critic.engine,
        optimizer_config=critic.optim,
        checkpoint_config=critic.checkpoint,
    )


def kill_workers(groups: list[Any], pool: Any, *, shutdown: bool) -> None:
    """Stop every worker process of `groups`, free the pool's GPUs and (`shutdown`) stop Ray."""
    import ray
    from ray.util.placement_group import remove_placement_group

    seen: set[Any] = set()
    for group in groups:
        for worker in group.workers:
            if worker in seen:  # colocated roles share their Ray actors
                continue
            seen.add(worker)
            try:
                ray.kill(worker)
            except Exception as err:  # already dead: nothing to free
                logger.debug("verl worker already gone: %s", err)
    for pg in pool.pgs or []:
        remove_placement_group(pg)
    if shutdown:
        ray.shutdown()
