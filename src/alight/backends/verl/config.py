"""verl's PPO trainer config for an alight experiment: verl's defaults, alight's settings, the user's
`verl:` block last.

`build_verl_config` composes verl's own `ppo_trainer.yaml` with Hydra, as `verl.trainer.main_ppo`
does (the installed wheel's defaults, not a copy that could drift), maps alight's settings onto it
and merges `cfg.verl` on top. Interpolations stay unresolved, so a passthrough value propagates the
way it does in verl (e.g. `critic.ppo_epochs` follows `actor_rollout_ref.actor.ppo_epochs`).

Mapping (`actor.` is `actor_rollout_ref.actor.`, `model.` is `actor_rollout_ref.model.`; notes below):

| alight | verl |
|---|---|
| model directory | `model.path`, `critic.model.path` |
| `algorithm.lr` | `actor.optim.lr` (the critic keeps verl's 1e-5) |
| `algorithm.betas`, `weight_decay` | `actor.optim.*`, `critic.optim.*` |
| `algorithm.warmup_steps` | `actor.optim.lr_warmup_steps`, `critic.optim.lr_warmup_steps` (1) |
| `algorithm.max_grad_norm` | `optim.clip_grad` and `grad_clip` of actor and critic; 0 becomes inf (2) |
| `algorithm.clip_ratio_low/high` | `actor.clip_ratio_low/high` (verl's dual clip stays on: see below) |
| `algorithm.loss_agg` | `actor.loss_agg_mode`: `token_mean` -> `token-mean`, `seq_mean_token_mean` -> |
| | `seq-mean-token-mean`, `seq_mean_token_sum` -> `seq-mean-token-sum` (the critic follows) |
| `algorithm.kl_coef` | `actor.use_kl_loss` (kl_coef > 0), `actor.kl_loss_coef`; never `use_kl_in_reward` |
| `algorithm.kl_estimator` | `actor.kl_loss_type`: the same names (kl, abs, mse, low_var_kl) |
| `algorithm.entropy_coef` | `actor.entropy_coeff` |
| `algorithm.epochs` (grpo), `ppo_epochs` (ppo) | `actor.ppo_epochs` (the critic follows) |
| `trainer.batch_size`, `group_size` | `data.train_batch_size` (tasks), `actor_rollout_ref.rollout.n` |
| `algorithm.mini_batch_size` | `actor.ppo_mini_batch_size` = ceil(mini / group_size) in [1, batch_size]; |
| | None: batch_size (3) |
| `algorithm.micro_batch_size` | `ppo_micro_batch_size_per_gpu` of actor and critic, |
| | `log_prob_micro_batch_size_per_gpu` of ref and rollout (rows per forward on one GPU) |
| `algorithm.name` ppo | `critic.enable: true`, `algorithm.adv_estimator: gae` |
| `algorithm.name` grpo, sft | `critic.enable: false`, `algorithm.adv_estimator: grpo` (4) |
| `algorithm.norm_std` | `algorithm.norm_adv_by_std_in_grpo` (4) |
| `trainer.mode` async, | `algorithm.rollout_correction`: `rollout_is: token`, `rollout_is_threshold: is_cap` |
| `algorithm.is_cap` | (0: inf); sync leaves verl's default (none). Applied to stale rows only (`correction`) |
| `algorithm.temperature` or | `actor_rollout_ref.rollout.temperature`: the log-prob temperature, 0 (greedy) |
| `engine.sampling.temperature` | becomes 1 as in the embedded backend (`logprob_temperature`) |
| `algorithm.lora` | `model.lora_rank` (0 when off), `model.lora_alpha`, `model.target_modules`, |
| | `model.lora.merge: true` (the engine gets merged weights); `lora.dropout` has no FSDP counterpart |
| `trainer.seed` | `data_loader_seed` of actor and critic, the FSDP `seed`s, `rollout.seed`, `data.seed` |
| `trainer.n_gpus_per_node`, `nnodes` | `trainer.n_gpus_per_node`, `trainer.nnodes` |
| `trainer.device` | `trainer.device`: `npu[:N]` -> npu, else cuda (alight's `trainer.device` defaults to the |
| | embedded backend's `cpu`); `verl: {trainer: {device: cpu}}` runs verl's workers on CPU (5) |
| run directory | `trainer.default_local_dir` = `<work_dir>/verl_checkpoints`, `trainer.project_name: |
| | alight`, `trainer.experiment_name` = `name` |
| flash-attn importable or not | `override_config.attn_implementation` of both models: flash_attention_2 / sdpa |
| (alight logs) | `trainer.logger: []`, `trainer.val_before_train: false` |
| (alight serves) | `actor_rollout_ref.rollout.name: vllm` (verl's `???`; nominal) |
| `verl:` | merged last; a key verl's config does not have is a ConfigError |

(1) verl's warm-up factor is step/warmup, alight's (step+1)/(warmup+1). (2) verl always clips, so
"no clipping" is an infinite norm. (3) See "Batch sizes". (4) Nominal: the advantages are
LightningRL's, handed over in the batch; verl computes none. (5) `cpu_platform` is verl's CPU
platform; `trainer.n_gpus_per_node` then counts worker processes. On CPU the strategy of actor,
reference and critic is `fsdp2` (FSDP1 needs a GPU: anything else is a ConfigError), and unless the
`verl:` block says otherwise `use_torch_compile` is off (a cold compile costs ~35 s a start) and
FSDP computes in float32 (`fsdp_config.mixed_precision`: bf16 matmuls are slow on most CPUs).

Batch sizes: verl counts `ppo_mini_batch_size` in prompts and multiplies by `rollout.n` for rows
per optimizer step; alight's `mini_batch_size` counts transitions, and a rollout yields one or more
transitions, so the configured value is only the nominal size `validate_config` checks. What one
update really uses comes from `alight.backends.verl.batch.update_layout`, on the batch's row count.

Dual clip: verl's vanilla policy loss takes min(loss, -A * clip_ratio_c) where the advantage is
negative; alight's loss has no such bound. They differ only on tokens with A < 0 and a ratio above
3 (far off-policy); `verl: {actor_rollout_ref: {actor: {clip_ratio_c: 1.0e9}}}` switches it off.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.backends.verl import correction
from alight.config.schema import ExperimentConfig, LoraConfig
from alight.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: alight's loss aggregation names -> verl's `loss_agg_mode`.
LOSS_AGG_MODES = {
    "token_mean": "token-mean",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
}

#: alight's KL estimators -> verl's `kl_loss_type` (verl also knows k1/k2/k3 and their "+" forms).
KL_LOSS_TYPES = {"kl": "kl", "abs": "abs", "mse": "mse", "low_var_kl": "low_var_kl"}

#: Folder under the run's work directory for verl's checkpoints.
CHECKPOINT_DIR = "verl_checkpoints"


def verl_config_dir() -> Path:
    """The folder of verl's trainer configs inside the installed wheel (found without importing verl)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError('trainer.backend verl needs verl: pip install "alight[verl]"')
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def verl_defaults() -> DictConfig:
    """verl's PPO trainer config as `main_ppo` composes it (`ppo_trainer.yaml` and its defaults list)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer")


#: verl's `trainer.device` that runs its workers on CPU (through `cpu_platform`).
CPU = "cpu"
#: verl's name for alight's CPU platform, and what a Ray worker's environment needs to load it.
CPU_PLATFORM = "alight-cpu"
CPU_WORKER_ENV = {"VERL_PLATFORM": CPU_PLATFORM, "VERL_USE_EXTERNAL_MODULES": "alight.backends.verl.cpu_platform"}
#: Where each model's FSDP strategy is set: verl's trainer config keys (actor, reference, critic).
STRATEGY_KEYS = (
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.actor.fsdp_config.strategy",
    "actor_rollout_ref.ref.strategy",
    "actor_rollout_ref.ref.fsdp_config.strategy",
    "critic.strategy",
    "critic.fsdp.strategy",
)
#: FSDP's compute dtypes on CPU unless the `verl:` block sets `mixed_precision`.
CPU_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def verl_device(cfg: ExperimentConfig) -> str:
    """The device verl's workers run on: the `verl:` block's `trainer.device` (cpu, cuda, npu),
    else npu for alight's `trainer.device: npu[:N]`, else cuda."""
    from omegaconf import OmegaConf

    chosen = OmegaConf.select(OmegaConf.create(dict(cfg.verl)), "trainer.device")
    if chosen:
        return str(chosen)
    return "npu" if cfg.trainer.device.startswith("npu") else "cuda"


def attn_implementation() -> str:
    """flash_attention_2 where flash-attn is installed, else sdpa (verl's default needs flash-attn)."""
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


def logprob_temperature(cfg: ExperimentConfig) -> float:
    """The temperature log-probs are computed at: the algorithm's, else the engine's sampling one;
    0 (greedy sampling) means 1, as in the embedded backend (dividing logits by 0 is meaningless)."""
    temperature = cfg.algorithm.temperature or cfg.engine.sampling.temperature
    return float(temperature) if temperature > 0 else 1.0


def ppo_mini_batch_prompts(cfg: ExperimentConfig) -> int:
    """verl's nominal `ppo_mini_batch_size` (prompts): alight's transitions per optimizer step over
    the group size, rounded up, within [1, trainer.batch_size]; None means the whole batch."""
    batch_size = cfg.trainer.batch_size
    mini = cfg.algorithm.mini_batch_size
    if mini is None:
        return batch_size
    return max(1, min(batch_size, math.ceil(mini / max(cfg.trainer.group_size, 1))))


def alight_settings(cfg: ExperimentConfig, model_dir: Path, *, work_dir: Path) -> dict[str, Any]:
    """alight's settings as a nested dict of verl keys (the table in the module docstring)."""
    algo, trainer = cfg.algorithm, cfg.trainer
    ppo = algo.name == "ppo"
    clip = float(algo.max_grad_norm) if algo.max_grad_norm > 0 else math.inf
    seed = trainer.seed
    micro = algo.micro_batch_size
    override = {"attn_implementation": attn_implementation()}
    optim = {
        "betas": [float(b) for b in algo.betas],
        "weight_decay": float(algo.weight_decay),
        "lr_warmup_steps": int(algo.warmup_steps),
        "clip_grad": clip,
    }
    device = verl_device(cfg)
    settings: dict[str, Any] = {
        "data": {"train_batch_size": trainer.batch_size, "seed": seed},
        "actor_rollout_ref": {
            "model": _policy_model_settings(algo.lora, model_dir, override),
            "actor": _actor_settings(cfg, optim, clip),
            "ref": {"log_prob_micro_batch_size_per_gpu": micro, "fsdp_config": {"seed": seed}},
            "rollout": {
                "name": "vllm",
                "n": trainer.group_size,
                "temperature": logprob_temperature(cfg),
                "log_prob_micro_batch_size_per_gpu": micro,
                "seed": seed,
            },
        },
        "critic": {
            "enable": ppo,
            "model": {"path": str(model_dir), "override_config": dict(override)},
            "optim": dict(optim),
            "grad_clip": clip,
            "ppo_micro_batch_size_per_gpu": micro,
            "data_loader_seed": seed,
            "fsdp": {"seed": seed},
        },
        "algorithm": {
            "adv_estimator": "gae" if ppo else "grpo",
            "norm_adv_by_std_in_grpo": bool(algo.norm_std),
            "use_kl_in_reward": False,
            **({"rollout_correction": correction.settings(algo)} if trainer.mode == "async" else {}),
        },
        "trainer": {
            "n_gpus_per_node": trainer.n_gpus_per_node,
            "nnodes": trainer.nnodes,
            "device": device,
            "default_local_dir": str(work_dir / CHECKPOINT_DIR),
            "project_name": "alight",
            "experiment_name": cfg.name,
            "logger": [],
            "val_before_train": False,
        },
    }
    if device == CPU:
        on_cpu(settings)
    return settings


def _policy_model_settings(lora: LoraConfig, model_dir: Path, override: dict[str, Any]) -> dict[str, Any]:
    """actor_rollout_ref.model: the policy's weights, and its LoRA adapters when enabled."""
    model: dict[str, Any] = {
        "path": str(model_dir),
        "override_config": override,
        "lora_rank": int(lora.r) if lora.enabled else 0,
    }
    if lora.enabled:  # merged: the engine serves full weights (verl would otherwise hand out adapters only)
        model.update(lora_alpha=int(lora.alpha), target_modules=list(lora.target_modules), lora={"merge": True})
    return model


def _actor_settings(cfg: ExperimentConfig, optim: dict[str, Any], clip: float) -> dict[str, Any]:
    """actor_rollout_ref.actor: the policy loss, its optimizer (`optim` with the actor's lr) and batching."""
    algo, seed, micro = cfg.algorithm, cfg.trainer.seed, cfg.algorithm.micro_batch_size
    return {
        "optim": {**optim, "lr": float(algo.lr)},
        "grad_clip": clip,
        "clip_ratio_low": float(algo.clip_ratio_low),
        "clip_ratio_high": float(algo.clip_ratio_high),
        "loss_agg_mode": LOSS_AGG_MODES[algo.loss_agg],
        "use_kl_loss": algo.kl_coef > 0,
        "kl_loss_coef": float(algo.kl_coef),
        "kl_loss_type": KL_LOSS_TYPES[algo.kl_estimator],
        "entropy_coeff": float(algo.entropy_coef),
        "ppo_epochs": algo.ppo_epochs if algo.name == "ppo" else algo.epochs,
        "ppo_mini_batch_size": ppo_mini_batch_prompts(cfg),
        "ppo_micro_batch_size_per_gpu": micro,
        "data_loader_seed": seed,
        "fsdp_config": {"seed": seed},
    }


def on_cpu(settings: dict[str, Any]) -> None:
    """verl's workers on CPU (note 5): `fsdp2` everywhere, no torch.compile, float32 FSDP."""
    for key in STRATEGY_KEYS:
        _set(settings, key, "fsdp2")
    for fsdp in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
        _set(settings, f"{fsdp}.use_torch_compile", False)
        _set(settings, f"{fsdp}.mixed_precision", dict(CPU_PRECISION))
    _set(settings, "actor_rollout_ref.actor.use_torch_compile", False)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def unknown_keys(base: DictConfig, overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """One line per key of `overrides` that `base` (verl's config) does not have, with a guess.

    Below a key whose verl value is an empty mapping or not a mapping (`override_config: {}`,
    `engine_kwargs.vllm: {}`, `lora.dtype: null`) anything goes: verl reads those freely.
    """
    from omegaconf import DictConfig

    errors = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        names = [str(k) for k in base.keys()]  # noqa: SIM118 - `in base` says no for a `???` value
        if key not in names:
            fields = target_fields(base)  # the fields of verl's dataclass: some the YAML leaves out
            if key in fields:
                continue
            close = difflib.get_close_matches(str(key), names + sorted(fields - set(names)), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            errors.append(f"verl.{path} is not a key of verl's trainer config{hint}")
            continue
        child = base._get_node(key)  # the node itself: no interpolation resolved, no `???` raised
        free = not isinstance(child, DictConfig) or child._is_interpolation() or len(child) == 0
        if isinstance(value, Mapping) and isinstance(child, DictConfig) and not free:
            errors.extend(unknown_keys(child, value, f"{path}."))
    return errors


def target_fields(node: DictConfig) -> set[str]:
    """The fields of the dataclass verl builds from `node` (its `_target_`), some of which its YAML
    leaves out (e.g. `FSDPEngineConfig.mixed_precision`); empty without a `_target_`. Imports verl's
    config classes, so it is asked only about a key the YAML lacks."""
    import dataclasses
    import importlib

    target = node.get("_target_") if "_target_" in node else None
    if not isinstance(target, str) or not target.startswith("verl."):
        return set()
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return set()
    return {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def build_verl_config(cfg: ExperimentConfig, model_dir: Path, *, work_dir: Path) -> DictConfig:
    """verl's full PPO trainer config for `cfg`: verl's defaults, alight's settings (module
    docstring), then `cfg.verl`. Returned in struct mode, as `main_ppo` receives it.

    Raises:
        ConfigError: `cfg.verl` names a key verl's config does not have (one line naming it).
    """
    from omegaconf import DictConfig, OmegaConf

    conf = verl_defaults()
    passthrough = OmegaConf.to_container(OmegaConf.create(dict(cfg.verl)), resolve=False)
    assert isinstance(passthrough, dict)
    errors = unknown_keys(conf, {str(key): value for key, value in passthrough.items()})
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(errors[0] + more)
    OmegaConf.set_struct(conf, False)  # override_config and the like take new keys
    merged = OmegaConf.merge(conf, alight_settings(cfg, model_dir, work_dir=work_dir), passthrough)
    assert isinstance(merged, DictConfig)
    if str(merged.trainer.device) == CPU:
        for key in STRATEGY_KEYS:
            if OmegaConf.select(merged, key) != "fsdp2":
                raise ConfigError(f"verl.{key} must be fsdp2 with verl.trainer.device cpu (FSDP1 needs a GPU)")
    OmegaConf.set_struct(merged, True)
    return merged


def critic_config(verl_config: Any) -> Any:
    """verl's `CriticConfig` dataclass of the `critic:` section."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(verl_config.critic)


def micro_rows(verl_config: Any, call: str, *, ref_in_actor: bool) -> int:
    """Rows per micro-batch of one rank in a worker call (`actor_infer`, `actor_update`, `ref`,
    `critic_infer`, `critic_update`), as verl's workers read it; 1 with dynamic batch sizes
    (verl then splits by tokens, with no divisibility to meet)."""
    config = verl_config.actor_rollout_ref
    if call.startswith("critic"):
        engine = critic_config(verl_config).engine
        dynamic = bool(engine.use_dynamic_bsz)
        micro = engine.infer_micro_batch_size_per_gpu if call == "critic_infer" else engine.micro_batch_size_per_gpu
    elif call == "ref" and not ref_in_actor:
        dynamic = bool(config.ref.get("log_prob_use_dynamic_bsz", False))
        micro = config.ref.get("log_prob_micro_batch_size_per_gpu")
    else:
        dynamic = bool(config.actor.use_dynamic_bsz)
        update = call == "actor_update"
        micro = (
            config.actor.ppo_micro_batch_size_per_gpu if update else config.rollout.log_prob_micro_batch_size_per_gpu
        )
    return 1 if dynamic or not micro else int(micro)


def model_max_length(model_dir: Path) -> int | None:
    """The context length a model directory's config states (None: none stated)."""
    config = model_dir / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_position_embeddings")
    return int(value) if value is not None else None
