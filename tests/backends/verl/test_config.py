"""`build_verl_config`: alight's settings land on keys verl has, and verl's own checks accept the result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

from omegaconf import DictConfig, OmegaConf

from alight.backends.verl import config as vc
from alight.errors import ConfigError

LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out.extend(leaves(value, f"{path}.") if isinstance(value, dict) else [path])
    return out


def build(experiment: Any, tmp_path: Path, model_dir: Path | None = None, **sections: Any) -> DictConfig:
    return vc.build_verl_config(experiment(**sections), model_dir or tmp_path / "model", work_dir=tmp_path / "run")


@pytest.mark.parametrize("sections", [{}, {"algorithm": {"name": "ppo", "kl_coef": 0.1}}])
def test_every_key_alight_sets_exists_in_verls_config(
    experiment: Any, tmp_path: Path, sections: dict[str, Any]
) -> None:
    from alight.config.schema import LoraConfig

    cfg = experiment(**sections)
    cfg.algorithm.lora = LoraConfig(**LORA)
    defaults = vc.verl_defaults()
    settings = vc.alight_settings(cfg, tmp_path, work_dir=tmp_path)
    missing = []
    for path in leaves(settings):
        parent, _, key = path.rpartition(".")
        node = OmegaConf.select(defaults, parent, throw_on_resolution_failure=False)
        # verl's open mappings (override_config: {}) take any key: that is how verl documents them
        if not (
            isinstance(node, DictConfig) and (key in list(node.keys()) or len(node) == 0)
        ):  # `in node` misses `???`
            missing.append(path)
    assert missing == []
    assert len(leaves(settings)) > 50


def test_composed_defaults_are_verls_generated_reference(tmp_path: Path) -> None:
    generated = OmegaConf.load(vc.verl_config_dir() / "_generated_ppo_trainer.yaml")
    composed = OmegaConf.to_container(vc.verl_defaults(), resolve=False)
    assert isinstance(composed, dict)
    assert composed.pop("model_engine") == "dp"
    assert composed == OmegaConf.to_container(generated, resolve=False)


@pytest.mark.parametrize(
    ("name", "kl_coef", "loss_agg", "kl_estimator"),
    [
        ("grpo", 0.0, "token_mean", "low_var_kl"),
        ("grpo", 0.05, "seq_mean_token_mean", "kl"),
        ("ppo", 0.1, "seq_mean_token_sum", "mse"),
        ("ppo", 0.0, "token_mean", "abs"),
    ],
)
def test_built_config_passes_verls_validation(
    experiment: Any, tmp_path: Path, tiny_dir: Path, name: str, kl_coef: float, loss_agg: str, kl_estimator: str
) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    algorithm = {
        "name": name,
        "kl_coef": kl_coef,
        "loss_agg": loss_agg,
        "kl_estimator": kl_estimator,
        "lr": 3e-6,
        "betas": [0.8, 0.95],
        "weight_decay": 0.05,
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.28,
        "entropy_coef": 0.01,
        "epochs": 2,
        "ppo_epochs": 3,
        "max_grad_norm": 0.5,
        "warmup_steps": 7,
    }
    conf = build(experiment, tmp_path, tiny_dir, algorithm=algorithm, trainer={"batch_size": 4, "group_size": 2})
    validate_config(conf, use_reference_policy=need_reference_policy(conf), use_critic=need_critic(conf))
    assert need_reference_policy(conf) is (kl_coef > 0)

    actor = omega_conf_to_dataclass(conf.actor_rollout_ref.actor)
    assert actor.loss_agg_mode == {"token_mean": "token-mean"}.get(loss_agg, loss_agg.replace("_", "-"))
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.1, 0.28)
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (kl_coef > 0, kl_coef, kl_estimator)
    assert actor.entropy_coeff == 0.01
    assert actor.ppo_epochs == (3 if name == "ppo" else 2)
    assert (actor.optim.lr, list(actor.optim.betas), actor.optim.weight_decay) == (3e-6, [0.8, 0.95], 0.05)
    assert (actor.optim.clip_grad, actor.optim.lr_warmup_steps) == (0.5, 7)
    assert actor.rollout_n == 2
    model = omega_conf_to_dataclass(conf.actor_rollout_ref.model)
    assert model.hf_config._attn_implementation == vc.attn_implementation()
    assert model.lora_rank == 0
    omega_conf_to_dataclass(conf.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(conf.algorithm)
    if name == "ppo":
        critic = omega_conf_to_dataclass(conf.critic)
        assert critic.ppo_epochs == 3
        assert critic.loss_agg_mode == actor.loss_agg_mode
        assert critic.optim.clip_grad == 0.5


def test_ppo_turns_the_critic_on_grpo_leaves_it_off(experiment: Any, tmp_path: Path) -> None:
    from verl.trainer.ppo.utils import need_critic

    ppo = build(experiment, tmp_path, algorithm={"name": "ppo"})
    assert (ppo.critic.enable, ppo.algorithm.adv_estimator, need_critic(ppo)) == (True, "gae", True)
    for name in ("grpo", "sft"):
        conf = build(experiment, tmp_path, algorithm={"name": name})
        assert (conf.critic.enable, conf.algorithm.adv_estimator, need_critic(conf)) == (False, "grpo", False)


def test_lora_maps_onto_verls_fsdp_lora_keys(experiment: Any, tmp_path: Path, tiny_dir: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    from alight.config.schema import LoraConfig

    cfg = experiment()
    cfg.algorithm.lora = LoraConfig(**LORA)
    conf = vc.build_verl_config(cfg, tiny_dir, work_dir=tmp_path)
    model = omega_conf_to_dataclass(conf.actor_rollout_ref.model)
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (4, 8, ["q_proj", "v_proj"])
    cfg.algorithm.lora.enabled = False
    off = vc.build_verl_config(cfg, tiny_dir, work_dir=tmp_path).actor_rollout_ref.model
    assert (off.lora_rank, off.target_modules) == (0, "all-linear")


def test_passthrough_wins_over_alights_settings(experiment: Any, tmp_path: Path) -> None:
    passthrough = {
        "actor_rollout_ref": {
            "actor": {"optim": {"lr": 3e-7}, "ppo_epochs": 5, "clip_ratio_c": 1.0e9},
            "model": {"override_config": {"attn_implementation": "eager", "rope_theta": 10.0}},
            "rollout": {"name": "sglang"},  # a `???` in verl's defaults
        },
        "trainer": {"logger": ["console"], "nnodes": 2},
    }
    conf = build(experiment, tmp_path, algorithm={"lr": 1e-5, "epochs": 2}, trainer={"nnodes": 1}, verl=passthrough)
    actor = conf.actor_rollout_ref.actor
    assert (actor.optim.lr, actor.ppo_epochs, actor.clip_ratio_c) == (3e-7, 5, 1.0e9)
    assert conf.critic.ppo_epochs == 5  # verl's interpolation follows the passthrough
    assert dict(conf.actor_rollout_ref.model.override_config) == {"attn_implementation": "eager", "rope_theta": 10.0}
    assert (list(conf.trainer.logger), conf.trainer.nnodes) == (["console"], 2)
    assert conf.actor_rollout_ref.rollout.name == "sglang"
    assert OmegaConf.is_struct(conf)


@pytest.mark.parametrize(
    ("passthrough", "named", "guess"),
    [
        ({"actor_rollout_ref": {"actor": {"ppo_epoch": 2}}}, "verl.actor_rollout_ref.actor.ppo_epoch", "ppo_epochs"),
        ({"trainers": {"nnodes": 2}}, "verl.trainers", "trainer"),
        ({"critic": {"optim": {"learning_rate": 1e-3}}}, "verl.critic.optim.learning_rate", None),
    ],
)
def test_an_unknown_passthrough_key_is_a_one_line_config_error(
    experiment: Any, tmp_path: Path, passthrough: dict[str, Any], named: str, guess: str | None
) -> None:
    with pytest.raises(ConfigError) as err:
        build(experiment, tmp_path, verl=passthrough)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{named} is not a key")
    assert ("did you mean" in message) is (guess is not None)
    if guess:
        assert message.endswith(f"{guess}?)")


def test_every_unknown_key_is_found_and_the_error_counts_them(experiment: Any, tmp_path: Path) -> None:
    passthrough = {"data": {"train_batch_sise": 3, "seed": 1}, "algorithm": {"gama": 0.9, "kl_ctrl": {"kl_coeff": 1}}}
    errors = vc.unknown_keys(vc.verl_defaults(), passthrough)
    assert [e.split(" ")[0] for e in errors] == [
        "verl.data.train_batch_sise",
        "verl.algorithm.gama",
        "verl.algorithm.kl_ctrl.kl_coeff",
    ]
    with pytest.raises(ConfigError, match=r"\(and 2 more\)$"):
        build(experiment, tmp_path, verl=passthrough)


@pytest.mark.parametrize(
    ("mini", "batch_size", "group_size", "prompts"),
    [(None, 8, 8, 8), (16, 8, 8, 2), (5, 8, 8, 1), (17, 8, 8, 3), (1000, 8, 8, 8), (3, 4, 1, 3)],
)
def test_mini_batch_of_transitions_becomes_verls_prompt_count(
    experiment: Any, tmp_path: Path, mini: int | None, batch_size: int, group_size: int, prompts: int
) -> None:
    conf = build(
        experiment,
        tmp_path,
        algorithm={"mini_batch_size": mini, "micro_batch_size": 3},
        trainer={"batch_size": batch_size, "group_size": group_size},
    )
    actor = conf.actor_rollout_ref.actor
    assert (actor.ppo_mini_batch_size, conf.data.train_batch_size, conf.actor_rollout_ref.rollout.n) == (
        prompts,
        batch_size,
        group_size,
    )
    assert actor.ppo_micro_batch_size_per_gpu == 3
    assert conf.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 3
    assert conf.critic.ppo_micro_batch_size_per_gpu == 3


def test_run_settings(experiment: Any, tmp_path: Path) -> None:
    conf = build(
        experiment,
        tmp_path,
        algorithm={"max_grad_norm": 0.0, "temperature": None},
        engine={"sampling": _sampling(0.0)},
        trainer={"seed": 11, "n_gpus_per_node": 4, "nnodes": 2, "device": "cuda:1"},
    )
    from verl.utils.config import omega_conf_to_dataclass

    assert math.isinf(conf.actor_rollout_ref.actor.optim.clip_grad)
    assert math.isinf(omega_conf_to_dataclass(conf.actor_rollout_ref.actor.optim).clip_grad)
    assert conf.actor_rollout_ref.rollout.temperature == 1.0  # greedy sampling: log-probs at 1
    assert conf.actor_rollout_ref.rollout.n_gpus_per_node == 4
    assert (conf.trainer.n_gpus_per_node, conf.trainer.nnodes, conf.trainer.device) == (4, 2, "cuda")
    assert conf.trainer.default_local_dir == str(tmp_path / "run" / vc.CHECKPOINT_DIR)
    assert (list(conf.trainer.logger), conf.trainer.experiment_name) == ([], "verl-test")
    seeds = [
        conf.actor_rollout_ref.actor.data_loader_seed,
        conf.actor_rollout_ref.actor.fsdp_config.seed,
        conf.actor_rollout_ref.ref.fsdp_config.seed,
        conf.actor_rollout_ref.rollout.seed,
        conf.critic.data_loader_seed,
        conf.critic.fsdp.seed,
        conf.data.seed,
    ]
    assert seeds == [11] * 7
    assert build(experiment, tmp_path, trainer={"device": "npu:0"}).trainer.device == "npu"


@pytest.mark.parametrize(("algorithm", "sampling", "expected"), [(None, 0.7, 0.7), (0.5, 0.7, 0.5), (None, 0.0, 1.0)])
def test_logprob_temperature(experiment: Any, algorithm: float | None, sampling: float, expected: float) -> None:
    cfg = experiment(algorithm={"temperature": algorithm}, engine={"sampling": _sampling(sampling)})
    assert vc.logprob_temperature(cfg) == expected


def _sampling(temperature: float) -> Any:
    from alight.config.schema import SamplingConfig

    return SamplingConfig(temperature=temperature)


# -- verl on CPU -------------------------------------------------------------------------------------
CPU = {"trainer": {"device": "cpu"}}


def test_the_cpu_device_forces_fsdp2_and_defaults_to_float32_without_compile(experiment: Any, tmp_path: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    built = build(experiment, tmp_path, algorithm={"name": "ppo"}, verl=CPU)
    assert built.trainer.device == "cpu"
    assert {OmegaConf.select(built, key) for key in vc.STRATEGY_KEYS} == {"fsdp2"}
    actor = built.actor_rollout_ref.actor
    assert actor.use_torch_compile is False and actor.fsdp_config.use_torch_compile is False
    assert built.actor_rollout_ref.ref.use_torch_compile is False and built.critic.fsdp.use_torch_compile is False
    engine = omega_conf_to_dataclass(actor.fsdp_config)  # the field verl's FSDP engine reads
    assert engine.mixed_precision == vc.CPU_PRECISION and engine.strategy == "fsdp2"
    gpu = build(experiment, tmp_path)  # nothing of it on the GPU path
    assert gpu.trainer.device == "cuda" and gpu.actor_rollout_ref.actor.strategy == "fsdp"
    assert "mixed_precision" not in gpu.actor_rollout_ref.actor.fsdp_config


def test_fsdp1_on_cpu_is_a_one_line_config_error(experiment: Any, tmp_path: Path) -> None:
    verl = {**CPU, "critic": {"strategy": "fsdp"}}
    with pytest.raises(ConfigError, match=r"^verl\.critic\.strategy must be fsdp2 with verl\.trainer\.device cpu"):
        build(experiment, tmp_path, algorithm={"name": "ppo"}, verl=verl)


def test_mixed_precision_is_a_key_of_verls_fsdp_config_the_yaml_leaves_out(experiment: Any, tmp_path: Path) -> None:
    precision = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    verl = {"actor_rollout_ref": {"actor": {"fsdp_config": {"mixed_precision": precision}}}}
    built = build(experiment, tmp_path, verl=verl)
    assert OmegaConf.to_container(built.actor_rollout_ref.actor.fsdp_config.mixed_precision) == precision
    typo = {"actor_rollout_ref": {"actor": {"fsdp_config": {"mixed_precisio": precision}}}}
    with pytest.raises(ConfigError, match=r"did you mean actor_rollout_ref\.actor\.fsdp_config\.mixed_precision\?"):
        build(experiment, tmp_path, verl=typo)


def test_the_cpu_backend_needs_no_cuda_and_names_its_platform_module(experiment: Any) -> None:
    import importlib.util

    from alight.backends.verl.backend import VerlBackend

    VerlBackend.check_config(experiment(trainer={"backend": "verl"}, warm_start={"steps": 0}, verl=CPU))
    module = vc.CPU_WORKER_ENV["VERL_USE_EXTERNAL_MODULES"]
    assert importlib.util.find_spec(module) is not None and vc.CPU_WORKER_ENV["VERL_PLATFORM"] == vc.CPU_PLATFORM
