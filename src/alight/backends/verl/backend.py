"""`VerlBackend` (`trainer.backend: verl`): verl's FSDP workers on Ray update the policy.

alight's engine (vLLM behind alight's proxy) does the rollouts, so verl runs no rollout worker: the
backend drives verl 0.9.1's model-engine workers (`workers.py`) the way verl's own PPO trainer
does, step by step, on alight's `TransitionBatch` converted to verl's `DataProto`:

1. rows recorded without the engine's log-probs get the actor's (`compute_log_prob`); stale rows
   (async training) get the actor's as their proximal policy, and the update becomes decoupled
   PPO with truncated importance weights (`correction`: verl's rollout correction);
2. with a KL penalty, the reference's log-probs (`compute_ref_log_prob`; with LoRA, the actor
   with its adapters off, as verl does);
3. PPO: the critic's values (`infer_batch`), advantages and returns by verl's
   `core_algos.compute_gae_advantage_return` on token-level rewards (the transition's reward on
   its last token), then the critic's update (`train_mini_batch`). GRPO: LightningRL's advantages
   as given, or verl's estimator when the user's `verl.algorithm.adv_estimator` names one;
4. the actor's update (`update_actor`), its metrics renamed into alight's.

Each worker call gets verl's no-padding TensorDict (`left_right_2_no_padding`), its rows padded to a
multiple of the data-parallel world times the call's micro-batch (verl's fixed micro-batching
asserts that each rank's rows divide by it), and of the mini-batch, with rows that carry no loss.
`engine_weights()` is a servable Hugging Face directory the actor writes (full weights gathered
from the FSDP shards, LoRA merged), which alight's vLLM engine reloads. verl's checkpoints (FSDP
shards, optimizer, scheduler, RNG of every rank) go under `<checkpoint>/verl/`.

No warm start: GPU models are pretrained (the warm start belongs to the embedded tiny-model demo),
so `warm_start.steps > 0` is refused at `check_config`, as are `algorithm.name: sft` and a machine
without CUDA (unless `RAY_ADDRESS` names a cluster whose nodes have the GPUs, or
`verl.trainer.device: cpu` runs the same workers on CPU through `cpu_platform`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.backends.base import FactoryDefaults
from alight.backends.verl.checks import INSTALL as INSTALL  # re-exported
from alight.backends.verl.checks import NEEDS as NEEDS  # re-exported
from alight.backends.verl.checks import NO_WARM_START, check_verl_backend
from alight.backends.verl.metrics import alight_metrics
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from verl import DataProto

    from alight.algorithms.batch import TransitionBatch
    from alight.backends.verl.workers import WorkerGroups

logger = logging.getLogger(__name__)

#: Where a checkpoint keeps verl's own state (beside the servable model at its top level).
VERL_DIR = "verl"
STATE_FILE = "state.json"
#: The servable model directory the actor rewrites after each update (under the work dir).
POLICY_DIR = "policy"

#: Tensors every worker call sends (what verl's unpadding and output slicing read).
SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask")

MakeWorkers = Callable[..., "WorkerGroups"]


class VerlBackend(FactoryDefaults):
    """verl's actor (+ reference, + critic for PPO) on Ray GPUs, fed `TransitionBatch`es (a `Backend`)."""

    #: The workers share the engine's GPUs (single node): the loop has vLLM sleep during `update`.
    colocated = True

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """Per-agent LoRA, a missing extra, `algorithm.name: sft`, a warm start, or no CUDA: one
        `ConfigError` line (`alight.backends.verl.checks`)."""
        check_verl_backend(cfg)

    @classmethod
    def from_config(
        cls,
        cfg: ExperimentConfig,
        model_dir: Path,
        *,
        work_dir: Path | None = None,
        make_workers: MakeWorkers | None = None,
    ) -> VerlBackend:
        """Build verl's config, start the worker groups (`make_workers`, default: verl's on Ray) and
        load the model from `model_dir` into them. `work_dir` holds the exported policy (default: a
        temporary directory removed on close)."""
        from alight.backends.verl.config import build_verl_config

        owned_dir = work_dir is None
        work_dir = Path(tempfile.mkdtemp(prefix="alight-verl-")) if work_dir is None else work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        verl_config = build_verl_config(cfg, model_dir, work_dir=work_dir)
        if make_workers is None:
            from alight.backends.verl.workers import ray_worker_groups

            make_workers = ray_worker_groups
        return cls(cfg, model_dir, verl_config, make_workers, work_dir=work_dir, owned_dir=owned_dir)

    def __init__(
        self,
        cfg: ExperimentConfig,
        model_dir: Path,
        verl_config: Any,
        make_workers: MakeWorkers,
        *,
        work_dir: Path,
        owned_dir: bool = False,
    ) -> None:
        from omegaconf import OmegaConf
        from verl.trainer.ppo.utils import need_critic, need_reference_policy

        from alight.backends.verl.config import logprob_temperature, model_max_length

        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.verl_config = verl_config
        self.work_dir = work_dir
        self._owned_dir = owned_dir
        actor = verl_config.actor_rollout_ref
        if verl_config.algorithm.get("use_kl_in_reward", False):
            raise ConfigError(
                "verl.algorithm.use_kl_in_reward is not supported: alight's KL is the loss term algorithm.kl_coef"
            )
        from alight.backends.verl import correction

        if cfg.trainer.mode == "async":  # stale rows come only then; sync ignores the correction as before
            correction.check(verl_config)
        self.use_ref = bool(need_reference_policy(verl_config))
        lora = actor.model.get("lora", {}) or {}
        self.ref_in_actor = int(lora.get("rank", 0) or actor.model.get("lora_rank", 0) or 0) > 0
        self.use_critic = bool(need_critic(verl_config))
        user_estimator = OmegaConf.select(OmegaConf.create(cfg.verl or {}), "algorithm.adv_estimator")
        # verl's estimator only when the user names one (or PPO's critic needs GAE): LightningRL's otherwise.
        self.estimator: str | None = str(user_estimator) if user_estimator else ("gae" if self.use_critic else None)
        if self.estimator == "gae" and not self.use_critic:
            raise ConfigError("verl.algorithm.adv_estimator gae needs a critic: algorithm.name=ppo")
        self.temperature = logprob_temperature(cfg)
        self.steps = 0
        self._exported = False  # the policy directory holds the current weights
        self._max_length = model_max_length(self.model_dir)
        self.workers: WorkerGroups = make_workers(
            verl_config, use_ref=self.use_ref and not self.ref_in_actor, use_critic=self.use_critic
        )
        try:
            self._init_models()
        except BaseException:
            self.workers.kill()
            raise

    def _init_models(self) -> None:
        """Load the models into the workers in verl's order: critic, reference, actor."""
        workers = self.workers
        if workers.critic is not None:
            from functools import partial

            from verl.workers.utils.losses import value_loss

            from alight.backends.verl.config import critic_config

            workers.critic.reset()
            workers.critic.set_loss_fn(partial(value_loss, config=critic_config(self.verl_config)))
        if workers.ref is not None:
            workers.ref.init_model()
        workers.actor.init_model()

    # -- the Backend protocol ---------------------------------------------------------------------
    @property
    def max_length(self) -> int | None:
        return self._max_length

    def warm_start(
        self,
        batches: Iterator[TransitionBatch],
        *,
        steps: int,
        lr: float,
        warmup_steps: int,
        on_progress: Callable[[int, float], None] | None = None,
    ) -> float:
        raise ConfigError(NO_WARM_START)

    def supervised_step(self, batch: TransitionBatch) -> dict[str, float]:
        raise ConfigError("trainer.backend verl does not fine-tune from a store; use trainer.backend=embedded")

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One update on `batch` (see the module docstring for the steps); metrics in alight's names."""
        from alight.backends.verl import correction
        from alight.backends.verl.batch import to_data_proto

        engine_rows = batch.has_old_log_probs if batch.stale is None else batch.has_old_log_probs & ~batch.stale
        engine_rows = engine_rows.clone()
        self._fill_old_log_probs(batch)
        correction.proximal_log_probs(batch, self._actor_log_probs)
        data = to_data_proto(batch, temperature=self.temperature)
        metrics = dict(correction.ON_POLICY_METRICS)
        if batch.proximal_log_probs is not None:
            metrics = correction.apply(data, batch.proximal_log_probs, self.verl_config)
        if self.cfg.trainer.log_prob_gap:
            metrics.update(self._log_prob_gap(batch, engine_rows))
        if self.use_ref:
            data.batch["ref_log_prob"] = self._log_probs(data, reference=True)
        if self.use_critic:
            data.batch["values"] = self._values(data)
        if self.estimator is not None:
            from alight.backends.verl.advantages import verl_advantages

            data.batch["advantages"], data.batch["returns"] = verl_advantages(data, self.estimator, self.verl_config)
        mini, rows = self._update_layout(len(batch))
        if self.use_critic:
            metrics.update(self._update_critic(data, mini, rows))
        metrics.update(self._update_actor(data, mini, rows))
        epochs = int(self.verl_config.actor_rollout_ref.actor.ppo_epochs)
        metrics["actor/update_tokens"] = float(epochs * int((batch.prompt_lengths + batch.response_lengths).sum()))
        self.steps += 1
        self._exported = False
        return metrics

    def engine_weights(self) -> str:
        """The servable model directory the actor writes with the current weights."""
        path = self.work_dir / POLICY_DIR
        if not self._exported:
            self.workers.actor.save_hf_model(str(path), str(self.model_dir))
            self._exported = True
        return str(path)

    def save(self, directory: Path) -> None:
        """verl's actor (and critic) checkpoint under `directory/verl/`, the servable model at `directory`."""
        verl_dir = directory / VERL_DIR
        verl_dir.mkdir(parents=True, exist_ok=True)
        self.workers.actor.save_checkpoint(str(verl_dir / "actor"), None, self.steps, None)
        if self.workers.critic is not None:
            self.workers.critic.save_checkpoint(str(verl_dir / "critic"), None, self.steps, None)
        self.workers.actor.save_hf_model(str(directory), str(self.model_dir))
        (verl_dir / STATE_FILE).write_text(json.dumps({"steps": self.steps}) + "\n")

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote (weights, optimizer, scheduler and RNG of every worker)."""
        verl_dir = directory / VERL_DIR
        if not (verl_dir / STATE_FILE).is_file():
            raise ConfigError(f"checkpoint {directory} holds no verl state (was it written by trainer.backend verl?)")
        self.workers.actor.load_checkpoint(str(verl_dir / "actor"), None, False)
        if self.workers.critic is not None:
            self.workers.critic.load_checkpoint(str(verl_dir / "critic"), None, False)
        self.steps = int(json.loads((verl_dir / STATE_FILE).read_text())["steps"])
        self._exported = False

    def close(self) -> None:
        """Kill the worker processes (and a Ray this backend started); remove its temporary directory."""
        self.workers.kill()
        if self._owned_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- the steps --------------------------------------------------------------------------------
    def _log_prob_gap(self, batch: TransitionBatch, engine_rows: torch.Tensor) -> dict[str, float]:
        """|engine - actor| log-prob over the tokens of the fresh rows the engine recorded, the actor's
        from a forward before the update (as verl's own loop recomputes its old log-probs)."""
        from alight.backends.losses import log_prob_gap

        rows = engine_rows.nonzero().flatten().tolist()
        if not rows:
            return {}
        part = batch.select(rows)
        total, worst, tokens = log_prob_gap(self._actor_log_probs(part), part.old_log_probs, part.response_mask)
        if not tokens:
            return {}
        return {"actor/logprob_gap_mean": total / tokens, "actor/logprob_gap_max": worst}

    def _fill_old_log_probs(self, batch: TransitionBatch) -> None:
        """Rows recorded without the engine's log-probs get the actor's (before any update)."""
        missing = (~batch.has_old_log_probs).nonzero().flatten().tolist()
        if not missing:
            return
        part = batch.select(missing)
        batch.old_log_probs[missing, : part.response_length] = self._actor_log_probs(part) * part.response_mask
        batch.has_old_log_probs[:] = True

    def _actor_log_probs(self, batch: TransitionBatch) -> torch.Tensor:
        """[B, R] the actor's log-probs of `batch`'s response tokens (its current weights)."""
        from alight.backends.verl.batch import to_data_proto

        return self._log_probs(to_data_proto(batch, temperature=self.temperature), reference=False)

    def _log_probs(self, data: DataProto, *, reference: bool) -> torch.Tensor:
        """[B, R] log-probs of the response tokens under the actor (or the reference)."""
        meta: dict[str, Any] = {"calculate_entropy": False, "compute_loss": False}
        if reference and self.ref_in_actor:
            meta["no_lora_adapter"] = True
        if reference and not self.ref_in_actor:
            assert self.workers.ref is not None
            call = self.workers.ref.compute_ref_log_prob
            micro = self._micro_rows("ref")
        else:
            call = self.workers.actor.compute_log_prob
            micro = self._micro_rows("actor_infer")
        return self._infer(call, data, "log_probs", meta, micro)

    def _values(self, data: DataProto) -> torch.Tensor:
        """[B, R] the critic's values of the response tokens."""
        assert self.workers.critic is not None
        call = self.workers.critic.infer_batch
        return self._infer(call, data, "values", {"compute_loss": False}, self._micro_rows("critic_infer"))

    def _infer(
        self, call: Callable[[Any], Any], data: DataProto, key: str, meta: dict[str, Any], micro: int
    ) -> torch.Tensor:
        """A forward-only worker call on `data`, its rows padded to a multiple of the world size
        times the call's micro-batch (`micro`) and the padding's outputs dropped."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        rows = len(data)
        inputs = self._worker_input(data, SEQUENCE_KEYS, self._world_size() * micro, meta, masked=False)
        output = _wait(call(inputs))
        padded: torch.Tensor = no_padding_2_padding(tu.get(output, key), inputs)
        return padded[:rows].float()

    def _update_critic(self, data: DataProto, mini: int, rows: int) -> dict[str, float]:
        from alight.backends.verl.batch import update_meta

        assert self.workers.critic is not None
        critic = self.verl_config.critic
        meta = update_meta(mini, int(critic.ppo_epochs), int(critic.data_loader_seed), bool(critic.shuffle))
        inputs = self._worker_input(data, (*SEQUENCE_KEYS, "values", "returns"), rows, meta, masked=True)
        return alight_metrics(_wait(self.workers.critic.train_mini_batch(inputs)), "critic/")

    def _update_actor(self, data: DataProto, mini: int, rows: int) -> dict[str, float]:
        from alight.backends.verl.batch import update_meta

        actor = self.verl_config.actor_rollout_ref.actor
        meta = update_meta(mini, int(actor.ppo_epochs), int(actor.data_loader_seed), bool(actor.shuffle))
        # entropy is always reported (as the embedded backend does); it joins the loss only with entropy_coeff
        meta.update(calculate_entropy=True, distillation_use_topk=False, distillation_only=False, compute_loss=True)
        optional = ("ref_log_prob", "rollout_is_weights")  # with a KL loss; with stale rows
        keys = (*SEQUENCE_KEYS, "old_log_probs", "advantages", *(key for key in optional if key in data.batch))
        inputs = self._worker_input(data, keys, rows, meta, masked=True)
        metrics = alight_metrics(_wait(self.workers.actor.update_actor(inputs)), "actor/")
        metrics.setdefault("actor/kl", 0.0)
        return metrics

    # -- worker input -----------------------------------------------------------------------------
    def _worker_input(
        self, data: DataProto, keys: tuple[str, ...], multiple: int, meta: dict[str, Any], *, masked: bool
    ) -> Any:
        from alight.backends.verl.batch import worker_input

        return worker_input(data, keys, multiple, meta, temperature=self.temperature, masked=masked)

    def _micro_rows(self, call: str) -> int:
        from alight.backends.verl.config import micro_rows

        return micro_rows(self.verl_config, call, ref_in_actor=self.ref_in_actor)

    def _world_size(self) -> int:
        return int(self.workers.actor.world_size)

    def _update_layout(self, rows: int) -> tuple[int, int]:
        """(rows per optimizer step, rows after padding) of an update on `rows` rows: the step a
        multiple of every updating worker's world size x micro-batch (`batch.update_layout`)."""
        from alight.backends.verl.batch import update_layout

        micro = self._micro_rows("actor_update")
        if self.use_critic:
            micro = math.lcm(micro, self._micro_rows("critic_update"))
        return update_layout(rows, self.cfg.algorithm.mini_batch_size, self._world_size(), micro)


def _wait(output: Any) -> Any:
    """A worker group's result: non-blocking calls (the critic's) return a future to `get`."""
    from tensordict import TensorDictBase  # type: ignore[import-untyped]

    return output if isinstance(output, TensorDictBase) else output.get()
