"""`VerlBackend` against stand-in worker groups: its call order and the data each call carries.

The stand-ins stand in for verl's GPU workers (the FSDP actor, the reference policy and the
critic), which need CUDA and cannot run here. They take the TensorDicts verl's workers take (the
no-padding layout `left_right_2_no_padding` makes, with its non-tensor settings) and answer in
verl's format: log-probs by a per-sequence forward pass of the real tiny model on CPU over the
unpadded tokens, values from the tokens, update metrics under verl's names, a model directory
written through alight's real export (`servable.write_hf_model`). Everything else is real: verl's
config, the DataProto conversion, verl's unpadding and output slicing, verl's `core_algos`.
Expected values come from independent computations: a padded batch forward pass of the model,
verl's own `compute_gae_advantage_return` on tensors built here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("tensordict")

import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.verl.backend import VerlBackend
from alight.backends.verl.workers import WorkerGroups
from alight.config.schema import AlgorithmConfig, ExperimentConfig, LoraConfig, WarmStartConfig
from alight.errors import ConfigError
from alight.types import Transition

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAD = 0
WORLD = 2  # the stand-in data-parallel world: batches must arrive padded to a multiple of it

Call = tuple[str, str]


# -- stand-ins for verl's GPU worker groups ----------------------------------------------------------
class Future:
    """What a non-blocking verl worker call returns (the critic's): the result on `get()`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class StandIn:
    """A worker group: records (group, method) in the shared call list and the TensorDicts it got."""

    world_size = WORLD

    def __init__(self, name: str, calls: list[Call], micro: dict[str, int] | None = None) -> None:
        self.name, self.calls = name, calls
        self.micro = micro or {}  # method -> micro_batch_size_per_gpu, as verl's worker reads it
        self.inputs: dict[str, list[Any]] = {}
        self.args: dict[str, list[tuple[Any, ...]]] = {}

    def _record(self, method: str, data: Any = None, *args: Any) -> None:
        self.calls.append((self.name, method))
        if data is not None:
            assert len(data) % WORLD == 0, f"{method}: {len(data)} rows do not split over {WORLD} ranks"
            # verl's fixed micro-batching (prepare_micro_batches): each rank's rows divide by the micro size
            unit = WORLD * self.micro.get(method, 1)
            assert method == "update_actor" or len(data) % unit == 0, f"{method}: {len(data)} rows, unit {unit}"
            self.inputs.setdefault(method, []).append(data)
        self.args.setdefault(method, []).append(args)

    def save_checkpoint(self, local_path: str, hdfs_path: Any, global_step: int, max_ckpt_to_keep: Any) -> None:
        self._record("save_checkpoint", None, local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: Any, del_local_after_load: bool) -> None:
        self._record("load_checkpoint", None, local_path, hdfs_path, del_local_after_load)


class StandInActor(StandIn):
    """verl's `ActorRolloutRefWorker` group (role actor or ref) with the tiny model on CPU."""

    def __init__(self, name: str, calls: list[Call], model: Any, micro: dict[str, int] | None = None) -> None:
        super().__init__(name, calls, micro)
        self.model = model

    def init_model(self) -> None:
        self._record("init_model")

    def _log_probs(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        temperature = tu.get(data, "temperature")
        values = []
        with torch.no_grad():
            for ids, positions in zip(data["input_ids"].unbind(), data["position_ids"].unbind(), strict=True):
                logits = self.model(input_ids=ids[None], position_ids=positions[None]).logits[0] / temperature
                lp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None])[:, 0]
                values.append(torch.cat([lp, lp.new_zeros(1)]))  # verl: position i holds token i+1's log-prob
        nested = torch.nested.nested_tensor_from_jagged(torch.cat(values), offsets=data["input_ids"].offsets())
        return tu.get_tensordict(tensor_dict={"log_probs": nested}, non_tensor_dict={"metrics": {"mfu": 0.1}})

    def compute_log_prob(self, data: Any) -> Any:
        self._record("compute_log_prob", data)
        return self._log_probs(data)

    def compute_ref_log_prob(self, data: Any) -> Any:
        self._record("compute_ref_log_prob", data)
        return self._log_probs(data)

    def update_actor(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.utils.metric import AggregationType

        self._record("update_actor", data)
        mini = tu.get(data, "mini_batch_size")
        assert mini % WORLD == 0 and len(data) % mini == 0
        assert (mini // WORLD) % self.micro.get("update_actor", 1) == 0, "a rank's mini-batch splits into micro-batches"
        metrics = {  # the shape verl's train_mini_batch returns (lists per micro-batch, Metric sums)
            "actor/pg_loss": metric(AggregationType.SUM, [0.25, 0.5]),
            "actor/pg_clipfrac": [0.1, 0.3],
            "actor/ppo_kl": [0.01, 0.03],
            "actor/pg_clipfrac_lower": [0.0, 0.0],
            "actor/entropy_loss": [2.0, 4.0],
            "loss": [0.5, 0.7],
            "grad_norm": [1.0, 3.0],
            "lr": [1e-6, 1e-6],
            "mfu": [0.2, 0.4],
        }
        if "ref_log_prob" in data.keys():  # noqa: SIM118 - a TensorDict has no `in`
            metrics.update({"kl_loss": metric(AggregationType.MEAN, [0.02, 0.04]), "kl_coef": [0.1, 0.1]})
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    def save_hf_model(self, path: str, base_dir: str | None = None) -> None:
        from alight.backends.verl.servable import write_hf_model

        self._record("save_hf_model", None, path, base_dir)
        write_hf_model(self.model.state_dict(), self.model.config, Path(path), base_dir=base_dir and Path(base_dir))


def metric(aggregation: Any, values: list[float]) -> Any:
    from verl.utils.metric import Metric

    out = Metric(aggregation)
    out.extend(values)
    return out


class StandInCritic(StandIn):
    """verl's critic `TrainingWorker` group: the value at each position is 0.01 x its token id."""

    def reset(self) -> None:
        self._record("reset")

    def set_loss_fn(self, loss_fn: Any) -> None:
        self._record("set_loss_fn", None, loss_fn)

    def infer_batch(self, data: Any) -> Future:
        from verl.utils import tensordict_utils as tu

        self._record("infer_batch", data)
        ids = data["input_ids"]
        values = torch.nested.nested_tensor_from_jagged(0.01 * ids.values().float(), offsets=ids.offsets())
        return Future(tu.get_tensordict(tensor_dict={"values": values}, non_tensor_dict={"metrics": {}}))

    def train_mini_batch(self, data: Any) -> Future:
        from verl.utils import tensordict_utils as tu

        self._record("train_mini_batch", data)
        metrics = {"critic/vf_loss": [0.5, 1.5], "critic/vf_clipfrac": [0.0, 0.2], "loss": [0.5, 1.5], "grad_norm": 2.0}
        return Future(tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}))


class Cluster:
    """`make_workers` for the backend: builds the stand-ins and records what it was asked for."""

    def __init__(self, actor_model: Any, ref_model: Any) -> None:
        self.calls: list[Call] = []
        self.actor_model, self.ref_model = actor_model, ref_model
        self.asked: dict[str, bool] = {}
        self.groups: WorkerGroups | None = None
        self.killed = 0

    def __call__(self, verl_config: Any, *, use_ref: bool, use_critic: bool) -> WorkerGroups:
        self.asked = {"use_ref": use_ref, "use_critic": use_critic}
        config = verl_config.actor_rollout_ref
        micro = {  # what verl's ActorRolloutRefWorker.init_model hands its engines
            "compute_log_prob": int(config.rollout.log_prob_micro_batch_size_per_gpu),
            "compute_ref_log_prob": int(config.ref.log_prob_micro_batch_size_per_gpu),
            "update_actor": int(config.actor.ppo_micro_batch_size_per_gpu),
        }
        self.groups = WorkerGroups(
            actor=StandInActor("actor", self.calls, self.actor_model, micro),
            ref=StandInActor("ref", self.calls, self.ref_model, micro) if use_ref else None,
            critic=StandInCritic("critic", self.calls) if use_critic else None,
            release=self._kill,
        )
        return self.groups

    def _kill(self) -> None:
        self.killed += 1

    @property
    def actor(self) -> StandInActor:
        assert self.groups is not None
        return self.groups.actor  # type: ignore[no-any-return]


# -- fixtures and independent computations ---------------------------------------------------------
@pytest.fixture(scope="module")
def models(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from alight.models.tiny import build_tiny_model

    ref_dir = tmp_path_factory.mktemp("ref") / "ref"
    build_tiny_model(ref_dir, seed=1)
    actor = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    return actor, reference


def config(*, log_prob_gap: bool = False, **algorithm: Any) -> ExperimentConfig:
    """The tests' config; the log-prob gap's extra actor forward is off unless a test measures it."""
    algorithm.setdefault("micro_batch_size", 1)  # padding to the world only; micro sizes: their own test
    cfg = ExperimentConfig(algorithm=AlgorithmConfig(**algorithm))
    cfg.trainer.log_prob_gap = log_prob_gap
    return cfg


def make(cfg: ExperimentConfig, tiny_dir: Path, models: tuple[Any, Any], work_dir: Path) -> tuple[VerlBackend, Cluster]:
    cluster = Cluster(*models)
    return VerlBackend.from_config(cfg, tiny_dir, work_dir=work_dir, make_workers=cluster), cluster


def batch_of(n: int, *, missing: tuple[int, ...] = (), seed: int = 0) -> TransitionBatch:
    """n transitions of different lengths in groups of 2, rewards 0/1, engine log-probs except `missing`."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        prompt = torch.randint(1, 250, (3 + 2 * i % 5,), generator=generator).tolist()
        response = torch.randint(1, 250, (2 + 3 * i % 4,), generator=generator).tolist()
        logprobs = None if i in missing else (-0.1 * torch.rand(len(response), generator=generator) - 0.5).tolist()
        rows.append(
            Transition.unchecked(
                prompt, response, float(i % 2), f"ro-{i}", group_id=f"g{i // 2}", advantage=0.5 - i % 2,
                response_logprobs=logprobs,
            )
        )  # fmt: skip
    return TransitionBatch.from_transitions(rows, PAD)


def forward_log_probs(model: Any, batch: TransitionBatch, temperature: float = 1.0) -> torch.Tensor:
    """[B, R] log-probs of the response tokens by one padded forward pass (masked)."""
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    logits = out.logits[:, batch.prompt_length - 1 : -1].float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, batch.responses[..., None])[..., 0]
    return lp * batch.response_mask


# -- call order and data -----------------------------------------------------------------------------
def test_grpo_without_kl_updates_the_actor_on_lightningrl_advantages(
    tiny_dir: Path, models: Any, tmp_path: Path
) -> None:
    backend, cluster = make(config(), tiny_dir, models, tmp_path)
    batch = batch_of(5)
    metrics = backend.update(batch)

    assert cluster.asked == {"use_ref": False, "use_critic": False}
    assert cluster.calls == [("actor", "init_model"), ("actor", "update_actor")]
    (data,) = cluster.actor.inputs["update_actor"]
    from verl.utils import tensordict_utils as tu

    assert len(data) == 6  # 5 rows padded to the 2-rank world; the whole batch is one mini-batch
    assert tu.get(data, "mini_batch_size") == 6 and tu.get(data, "epochs") == 1
    assert tu.get(data, "temperature") == 1.0 and tu.get(data, "calculate_entropy") is True
    assert "ref_log_prob" not in data.keys()  # noqa: SIM118
    assert torch.equal(data["advantages"][:5], batch.advantages)
    assert torch.equal(data["old_log_probs"][:5], batch.old_log_probs)
    assert data["response_mask"][5:].sum() == 0 and data["advantages"][5:].abs().sum() == 0  # padding: no loss
    assert torch.equal(data["input_ids"].offsets().diff()[:5], batch.prompt_lengths + batch.response_lengths)

    # verl's metrics reduced and renamed into alight's names; verl's others pass through
    assert metrics["actor/loss"] == pytest.approx(0.6)
    assert metrics["actor/pg_loss"] == pytest.approx(0.75)  # a SUM Metric
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.2)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.02)
    assert metrics["actor/entropy"] == pytest.approx(3.0)
    assert metrics["actor/grad_norm"] == pytest.approx(2.0)
    assert metrics["actor/lr"] == pytest.approx(1e-6)
    assert metrics["actor/kl"] == 0.0
    assert metrics["actor/mfu"] == pytest.approx(0.3)
    assert "actor/entropy_loss" not in metrics
    tokens = int((batch.prompt_lengths + batch.response_lengths).sum())
    assert metrics["actor/update_tokens"] == float(tokens)


def test_kl_asks_the_reference_before_the_update(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    backend, cluster = make(config(kl_coef=0.1), tiny_dir, models, tmp_path)
    batch = batch_of(4)
    metrics = backend.update(batch)

    assert cluster.asked == {"use_ref": True, "use_critic": False}
    assert cluster.calls == [
        ("ref", "init_model"),
        ("actor", "init_model"),
        ("ref", "compute_ref_log_prob"),
        ("actor", "update_actor"),
    ]
    (data,) = cluster.actor.inputs["update_actor"]
    expected = forward_log_probs(models[1], batch)  # the reference model, not the actor
    torch.testing.assert_close(data["ref_log_prob"][:4] * batch.response_mask, expected, atol=1e-5, rtol=1e-5)
    assert metrics["actor/kl"] == pytest.approx(0.03)
    assert "actor/kl_coef" not in metrics


def test_kl_with_lora_uses_the_actor_with_adapters_off(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    lora = LoraConfig(enabled=True, r=4)
    backend, cluster = make(config(kl_coef=0.1, lora=lora), tiny_dir, models, tmp_path)
    backend.update(batch_of(4))

    from verl.utils import tensordict_utils as tu

    assert cluster.asked == {"use_ref": False, "use_critic": False}
    assert cluster.calls == [("actor", "init_model"), ("actor", "compute_log_prob"), ("actor", "update_actor")]
    (data,) = cluster.actor.inputs["compute_log_prob"]
    assert tu.get(data, "no_lora_adapter") is True
    assert "ref_log_prob" in cluster.actor.inputs["update_actor"][0].keys()  # noqa: SIM118


def test_the_log_prob_gap_is_the_engines_against_the_actors_before_the_update(
    tiny_dir: Path, models: Any, tmp_path: Path
) -> None:
    """One actor forward of the fresh rows the engine recorded (not of the rows it did not, nor the
    stale ones), before the update; |engine - actor| over their response tokens."""
    cfg = config(log_prob_gap=True)
    cfg.trainer.mode = "async"
    backend, cluster = make(cfg, tiny_dir, models, tmp_path)
    batch = batch_of(6, missing=(2,))
    actor = forward_log_probs(models[0], batch)
    batch.old_log_probs[0] = (actor[0] + 0.25) * batch.response_mask[0]  # the engine 0.25 off on row 0
    batch.old_log_probs[3] = actor[3] * batch.response_mask[3]
    batch.mark_stale({"ro-5"})
    engine = batch.old_log_probs.clone()
    metrics = backend.update(batch)

    fresh = [0, 1, 3, 4]  # recorded by the engine and not stale
    asked = cluster.actor.inputs["compute_log_prob"]
    assert [len(a) for a in asked] == [2, 2, 4]  # row 2's missing log-probs, stale row 5, the 4 fresh rows
    mask = batch.response_mask.bool()
    gaps = torch.cat([(engine[r] - actor[r]).abs()[mask[r]] for r in fresh])
    assert metrics["actor/logprob_gap_mean"] == pytest.approx(float(gaps.mean()), abs=1e-5)
    assert metrics["actor/logprob_gap_max"] == pytest.approx(float(gaps.max()), abs=1e-5)
    assert float(gaps.max()) >= 0.25 - 1e-5  # row 0's offset is seen


def test_rows_without_engine_log_probs_get_the_actors(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    cfg = config(temperature=0.8)
    backend, cluster = make(cfg, tiny_dir, models, tmp_path)
    batch = batch_of(6, missing=(1, 2, 4))
    engine = batch.old_log_probs.clone()
    expected = forward_log_probs(models[0], batch, temperature=0.8)
    backend.update(batch)

    from verl.utils import tensordict_utils as tu

    assert cluster.calls == [("actor", "init_model"), ("actor", "compute_log_prob"), ("actor", "update_actor")]
    (asked,) = cluster.actor.inputs["compute_log_prob"]
    assert len(asked) == 4  # the 3 rows without log-probs, padded to the world
    assert tu.get(asked, "temperature") == 0.8 and tu.get(asked, "compute_loss") is False
    assert batch.has_old_log_probs.all()
    for row in range(6):
        if row in (1, 2, 4):
            torch.testing.assert_close(batch.old_log_probs[row], expected[row], atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(batch.old_log_probs[row], engine[row])
    (data,) = cluster.actor.inputs["update_actor"]
    assert torch.equal(data["old_log_probs"][:6], batch.old_log_probs)


def test_stale_rows_train_against_the_actors_proximal_log_probs_with_verls_is_weights(
    tiny_dir: Path, models: Any, tmp_path: Path
) -> None:
    cfg = config(is_cap=1.5)
    cfg.trainer.mode = "async"
    backend, cluster = make(cfg, tiny_dir, models, tmp_path)
    batch = batch_of(6)
    proximal = forward_log_probs(models[0], batch)  # the actor before the update
    mask = batch.response_mask.bool()
    batch.old_log_probs[4] = (proximal[4] - 1.0) * batch.response_mask[4]  # w = e^1: over the cap
    behaviour = batch.old_log_probs.clone()
    batch.mark_stale({"ro-1", "ro-4"})
    metrics = backend.update(batch)

    assert cluster.calls == [("actor", "init_model"), ("actor", "compute_log_prob"), ("actor", "update_actor")]
    assert len(cluster.actor.inputs["compute_log_prob"][0]) == 2  # the 2 stale rows (a multiple of the world)
    (data,) = cluster.actor.inputs["update_actor"]
    stale = torch.tensor([i in (1, 4) for i in range(6)])
    anchor = torch.where(stale[:, None], proximal, behaviour)
    torch.testing.assert_close(data["old_log_probs"][:6][mask], anchor[mask], atol=1e-5, rtol=1e-5)
    weights = torch.where(stale[:, None], (proximal - behaviour).exp().clamp(max=1.5), torch.ones_like(proximal))
    torch.testing.assert_close(data["rollout_is_weights"][:6][mask], weights[mask], atol=1e-5, rtol=1e-5)
    assert metrics["actor/is_weight_mean"] == pytest.approx(float(weights[mask].mean()), abs=1e-5)
    assert metrics["actor/is_capped_frac"] == pytest.approx(float(mask[4].sum() / mask.sum()))
    assert "rollout_log_probs" not in data.keys()  # noqa: SIM118 - workers get only what the loss reads


def test_a_batch_without_stale_rows_sends_the_workers_what_sync_mode_sends(
    tiny_dir: Path, models: Any, tmp_path: Path
) -> None:
    sent = []
    for mode in ("sync", "async"):
        cfg = config()
        cfg.trainer.mode = mode
        backend, cluster = make(cfg, tiny_dir, models, tmp_path / mode)
        metrics = backend.update(batch_of(5))
        assert metrics["actor/is_weight_mean"] == 1.0 and metrics["actor/is_capped_frac"] == 0.0
        assert cluster.calls == [("actor", "init_model"), ("actor", "update_actor")]
        sent.append(cluster.actor.inputs["update_actor"][0])
    sync, asyn = sent
    assert sorted(sync.keys()) == sorted(asyn.keys()) and "rollout_is_weights" not in sync.keys()  # noqa: SIM118
    for key in sync.keys():  # noqa: SIM118
        if isinstance(sync[key], torch.Tensor):
            ours, theirs = (t.values() if t.is_nested else t for t in (sync[key], asyn[key]))
            assert torch.equal(ours, theirs), key


def test_ppo_trains_the_critic_on_verls_gae(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return
    from verl.utils import tensordict_utils as tu

    cfg = replace(config(name="ppo", ppo_epochs=2), verl={"algorithm": {"gamma": 0.9, "lam": 0.8}})
    backend, cluster = make(cfg, tiny_dir, models, tmp_path)
    batch = batch_of(5)
    metrics = backend.update(batch)

    assert cluster.asked == {"use_ref": False, "use_critic": True}
    assert cluster.calls == [
        ("critic", "reset"),
        ("critic", "set_loss_fn"),
        ("actor", "init_model"),
        ("critic", "infer_batch"),
        ("critic", "train_mini_batch"),
        ("actor", "update_actor"),
    ]
    # independent tensors: the value before each response token is 0.01 x the token before it;
    # the transition's reward sits on its last response token
    mask = batch.response_mask.float()
    values = torch.zeros_like(mask)
    rewards = torch.zeros_like(mask)
    for row in range(5):
        p, r = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
        tokens = batch.input_ids[row][batch.attention_mask[row].bool()]
        values[row, :r] = 0.01 * tokens[p - 1 : p + r - 1].float()
        rewards[row, r - 1] = batch.rewards[row]
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)

    (critic_data,) = cluster.groups.critic.inputs["train_mini_batch"]  # type: ignore[union-attr]
    torch.testing.assert_close(critic_data["values"][:5] * mask, values, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(critic_data["returns"][:5] * mask, returns * mask, atol=1e-6, rtol=1e-6)
    assert tu.get(critic_data, "epochs") == backend.verl_config.critic.ppo_epochs
    (actor_data,) = cluster.actor.inputs["update_actor"]
    torch.testing.assert_close(actor_data["advantages"][:5] * mask, advantages * mask, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(actor_data["advantages"][:5], batch.advantages)  # GAE, not LightningRL's
    assert tu.get(actor_data, "epochs") == backend.verl_config.actor_rollout_ref.actor.ppo_epochs == 2
    assert metrics["critic/vf_loss"] == pytest.approx(1.0)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.1)
    assert metrics["critic/grad_norm"] == pytest.approx(2.0)
    assert metrics["actor/update_tokens"] == 2.0 * int((batch.prompt_lengths + batch.response_lengths).sum())


def test_verl_estimator_when_the_verl_block_names_one(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    cfg = replace(config(), verl={"algorithm": {"adv_estimator": "grpo"}})
    backend, cluster = make(cfg, tiny_dir, models, tmp_path)
    batch = batch_of(6)
    backend.update(batch)

    mask = batch.response_mask
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(6), batch.response_lengths - 1] = batch.rewards
    import numpy as np

    expected, _ = compute_grpo_outcome_advantage(
        rewards, mask, np.array([f"g{i // 2}" for i in range(6)], dtype=object)
    )
    (data,) = cluster.actor.inputs["update_actor"]
    torch.testing.assert_close(data["advantages"][:6], expected, atol=1e-6, rtol=1e-6)


def test_rows_are_padded_to_whole_micro_batches_on_every_rank(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    """The GPU bug: rows padded to the world only fail verl's fixed micro-batching ("data size must
    be divisible by force_group_size * micro_batch_size_per_gpu") when a rank's rows are not a
    multiple of the micro size: 5 rows on 2 ranks with micro 2 need 8 (each rank 2 micro-batches)."""
    from verl.utils import tensordict_utils as tu

    backend, cluster = make(config(micro_batch_size=2), tiny_dir, models, tmp_path)
    batch = batch_of(5, missing=(0, 3, 4))
    backend.update(batch)
    (asked,) = cluster.actor.inputs["compute_log_prob"]
    assert len(asked) == 4  # 3 rows without log-probs -> 2 ranks x 1 micro-batch of 2
    (data,) = cluster.actor.inputs["update_actor"]
    assert len(data) == 8 and tu.get(data, "mini_batch_size") == 8
    # the added rows carry no loss: no response token counts, no advantage
    assert data["response_mask"][5:].sum() == 0 and data["advantages"][5:].abs().sum() == 0
    assert data["response_mask"][:5].sum() == batch.response_mask.sum()


def test_mini_batches_are_whole_multiples_of_the_world(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    from verl.utils import tensordict_utils as tu

    backend, cluster = make(config(mini_batch_size=3), tiny_dir, models, tmp_path)
    backend.update(batch_of(7))
    (data,) = cluster.actor.inputs["update_actor"]
    assert tu.get(data, "mini_batch_size") == 4 and len(data) == 8


# -- weights, checkpoints, close ---------------------------------------------------------------------
def test_engine_weights_is_the_directory_the_actor_wrote(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    backend, cluster = make(config(), tiny_dir, models, tmp_path)
    backend.update(batch_of(2))
    path = backend.engine_weights()
    assert path == str(tmp_path / "policy")
    assert cluster.actor.args["save_hf_model"] == [(path, str(tiny_dir))]
    assert backend.engine_weights() == path and len(cluster.actor.args["save_hf_model"]) == 1  # no new update
    written = {}
    for file in Path(path).glob("*.safetensors"):
        written.update(load_file(str(file)))
    reference = load_file(str(tiny_dir / "model.safetensors"))
    assert written.keys() == reference.keys()
    assert all(torch.equal(written[k], reference[k].to(written[k].dtype)) for k in reference)
    assert json.loads((Path(path) / "config.json").read_text())["model_type"] == "qwen2"
    backend.update(batch_of(2))
    backend.engine_weights()
    assert len(cluster.actor.args["save_hf_model"]) == 2


def test_save_and_load_go_through_verls_checkpoints(tiny_dir: Path, models: Any, tmp_path: Path) -> None:
    backend, cluster = make(config(name="ppo"), tiny_dir, models, tmp_path / "work")
    backend.update(batch_of(2))
    checkpoint = tmp_path / "step-1"
    backend.save(checkpoint)
    critic = cluster.groups.critic  # type: ignore[union-attr]
    assert cluster.actor.args["save_checkpoint"] == [(str(checkpoint / "verl" / "actor"), None, 1, None)]
    assert critic.args["save_checkpoint"] == [(str(checkpoint / "verl" / "critic"), None, 1, None)]
    assert (checkpoint / "config.json").is_file() and list(checkpoint.glob("*.safetensors"))

    again, cluster2 = make(config(name="ppo"), tiny_dir, models, tmp_path / "work2")
    again.load(checkpoint)
    assert again.steps == 1
    assert cluster2.actor.args["load_checkpoint"] == [(str(checkpoint / "verl" / "actor"), None, False)]
    assert cluster2.groups.critic.args["load_checkpoint"] == [(str(checkpoint / "verl" / "critic"), None, False)]  # type: ignore[union-attr]
    again.engine_weights()  # loaded weights differ from the base: exported again
    assert len(cluster2.actor.args["save_hf_model"]) == 1
    with pytest.raises(ConfigError, match="no verl state"):
        again.load(tmp_path)


def test_close_kills_the_workers_and_removes_its_own_directory(
    tiny_dir: Path, models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(*models)
    backend = VerlBackend.from_config(config(), tiny_dir, make_workers=cluster)
    work_dir = backend.work_dir
    assert work_dir.is_dir()
    assert backend.max_length == json.loads((tiny_dir / "config.json").read_text())["max_position_embeddings"]
    backend.close()
    backend.close()
    assert cluster.killed == 1 and not work_dir.exists()


# -- what check_config refuses -----------------------------------------------------------------------
def test_check_config_refuses_sft_a_warm_start_and_a_machine_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from alight.backends.factory import check_backend

    with pytest.raises(ConfigError, match="grpo or ppo"):
        VerlBackend.check_config(config(name="sft"))
    with pytest.raises(ConfigError, match="no warm start"):
        VerlBackend.check_config(replace(config(), warm_start=WarmStartConfig(steps=10, data="x")))
    bf16 = replace(config(), algorithm=replace(config().algorithm, precision="bf16"))
    with pytest.raises(ConfigError, match=r"^algorithm.precision=bf16 is the embedded backend's; verl sets its own"):
        VerlBackend.check_config(bf16)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = replace(config(), trainer=replace(ExperimentConfig().trainer, backend="verl"))
    with pytest.raises(ConfigError, match="needs CUDA GPUs") as err:
        check_backend(cfg)
    assert "\n" not in str(err.value)


def test_choosing_verl_without_it_installed_is_one_line_naming_the_extra() -> None:
    code = (
        "import sys; sys.modules['verl'] = None\n"
        "from dataclasses import replace\n"
        "from alight.backends.factory import check_backend\n"
        "from alight.config.schema import ExperimentConfig\n"
        "from alight.errors import ConfigError\n"
        "cfg = ExperimentConfig()\n"
        "cfg = replace(cfg, trainer=replace(cfg.trainer, backend='verl'))\n"
        "try:\n    check_backend(cfg)\nexcept ConfigError as err:\n    print(str(err))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'trainer.backend verl needs verl: pip install "alight[verl]"'


def test_the_gpu_calc_config_loads_and_passes_the_checks_up_to_the_gpu(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.backends.factory import check_backend
    from alight.backends.verl.config import build_verl_config
    from alight.config import load_config, to_object

    repo = Path(__file__).resolve().parents[3]
    cfg = to_object(load_config(repo / "configs" / "calc_gpu.yaml", ["engine.model=/models/Qwen2.5-1.5B-Instruct"]))
    assert (cfg.trainer.backend, cfg.engine.kind, cfg.warm_start.steps) == ("verl", "vllm", 0)
    assert cfg.engine.model == "/models/Qwen2.5-1.5B-Instruct"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs CUDA GPUs"):  # every check before it passed
        check_backend(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_backend(cfg)
    verl = build_verl_config(cfg, tiny_dir, work_dir=tmp_path)  # its verl: block names verl's keys
    assert verl.actor_rollout_ref.actor.fsdp_config.param_offload is True
