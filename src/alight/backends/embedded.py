"""The embedded backend: the policy trained with PyTorch in the trainer's process (CPU or one GPU).

It consumes `TransitionBatch`es only. An RL update is the clipped policy loss over token log-prob
ratios against the engine's log-probs (GRPO: one epoch, one optimizer step per batch by default;
PPO: several epochs over shuffled mini-batches), plus an optional KL penalty to the frozen starting
policy and an entropy bonus; AdamW with warm-up, gradient clipping and accumulation over
micro-batches; optionally LoRA adapters (peft) instead of every weight. `engine_weights()` gives
the full weights the engine serves next (LoRA merged in).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.algorithms.batch import TransitionBatch
from alight.backends import checkpoint, losses, memory
from alight.backends.base import FactoryDefaults
from alight.backends.chunked import response_log_probs
from alight.backends.lora import load_adapter, merged_weights, save_adapters, with_lora
from alight.backends.objective import objective
from alight.backends.optimization import Optimization
from alight.backends.policy_step import (
    StepSums,
    add_log_prob_gap,
    fill_log_probs,
    micro_batch_loss,
    skipped_update_metrics,
)
from alight.backends.precision import autocast, resolve_precision
from alight.config.schema import AlgorithmConfig, ExperimentConfig
from alight.engines.factory import engine_class
from alight.errors import ConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

AUTO = "auto"  # algorithm.micro_batch_size: the most rows that fit (alight.backends.memory)
#: Prompt tokens assumed when checking that micro_batch_size fits and adapter.max_prompt_length is unset.
ASSUMED_PROMPT_TOKENS = 256
ENGINE_ROWS = "_engine_log_probs"  # batch.meta during an update: rows whose log-probs the engine recorded
ADAPTER_DIR = "adapter"  # a checkpoint's folder of the LoRA adapter (peft's format)


class EmbeddedBackend(FactoryDefaults):
    """The trainable policy, its optimizer and (with `kl_coef`) a frozen reference (a `Backend`)."""

    #: The update runs beside the engine: both fit (the embedded engine holds its own copy).
    colocated = False

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """Settings only this backend refuses (the shared algorithm checks run first)."""
        if cfg.verl:
            raise ConfigError("the config has a verl: block but trainer.backend is embedded; set trainer.backend=verl")

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model_dir: Path, *, work_dir: Path | None = None) -> EmbeddedBackend:
        """`work_dir` is unused: this backend keeps everything in memory between checkpoints."""
        temperature = cfg.algorithm.temperature or cfg.engine.sampling.temperature
        same_device = cfg.engine.device.split(":")[0] == cfg.trainer.device.split(":")[0]
        return cls(
            model_dir,
            cfg.algorithm,
            device=cfg.trainer.device,
            temperature=temperature,
            seed=cfg.trainer.seed,
            engine_copy=engine_class(cfg.engine.kind).capabilities.in_process and same_device,
            row_tokens=(cfg.adapter.max_prompt_length or ASSUMED_PROMPT_TOKENS) + cfg.engine.sampling.max_tokens,
        )

    def __init__(
        self,
        model_path: str | Path,
        algorithm: AlgorithmConfig,
        *,
        device: str = "cpu",
        temperature: float = 1.0,
        seed: int = 0,
        engine_copy: bool = False,  # the embedded engine holds another copy of the weights on this device
        row_tokens: int | None = None,  # the longest rows expected: checks micro_batch_size fits (None: no check)
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from alight.models.progress import progress_bars_off

        self.cfg = algorithm
        self.objective = objective(algorithm)
        self._gap = [0.0, 0.0, 0.0]  # the update's engine-trainer log-prob gap: sum, max, tokens
        self.device = torch.device(device)
        self.precision = resolve_precision(algorithm.precision, str(self.device))
        self.temperature = temperature if temperature > 0 else 1.0
        self.model_path = Path(model_path)
        self.generator = torch.Generator().manual_seed(seed)
        with progress_bars_off():
            model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        model.config.use_cache = False
        if algorithm.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = algorithm.lora.enabled
        if self.lora:
            model = with_lora(model, algorithm.lora)
        self.model: Any = model.to(self.device)
        self.model.train()
        self.reference: Any = None
        if algorithm.kl_coef > 0 and not self.lora:  # with LoRA the reference is the model, adapters off
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimization: Optimization | None = self._optimization_for(algorithm.lr, algorithm.warmup_steps)
        self.shape = memory.model_shape(self.model)
        self._auto = memory.AutoMicroBatch(
            str(self.device),
            fraction=algorithm.memory_fraction,
            chunk_tokens=algorithm.log_prob_chunk,
            checkpointing=algorithm.gradient_checkpointing,
        )
        memory.check_update_fits(  # before the first step: a ConfigError when the update cannot fit
            self.shape,
            free=memory.available_bytes(str(self.device)),
            pending=self._pending_bytes(),
            engine_copy=engine_copy,
            model_name=self.model_path.name,
            micro_batch_size=None if algorithm.micro_batch_size == AUTO else int(algorithm.micro_batch_size),
            row_tokens=row_tokens,
            chunk_tokens=algorithm.log_prob_chunk,
            checkpointing=algorithm.gradient_checkpointing,
        )

    @property
    def max_length(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def close(self) -> None:
        """Drop the model, the reference and the optimizer state (and their accelerator memory)."""
        self.model = self.reference = self.optimization = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    # -- optimizer --------------------------------------------------------------------------------
    def _optimization_for(self, lr: float, warmup_steps: int) -> Optimization:
        """A fresh AdamW and schedule over the weights that train now."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return Optimization(params, self.cfg, lr=lr, warmup_steps=warmup_steps)

    def _optimization(self) -> Optimization:
        """The optimizer and schedule an update steps: the policy's."""
        if self.optimization is None:
            raise RuntimeError("the backend is closed")
        return self.optimization

    # -- forward --------------------------------------------------------------------------------
    def log_probs(
        self, batch: TransitionBatch, model: Any = None, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([B, R] log-probs of the response tokens, [B, R] their entropy when asked, else None) under
        `model` (default: the policy); 0 where the response mask is 0. The output layer runs on
        chunks of `algorithm.log_prob_chunk` tokens (see `alight.backends.chunked`), the decoder in
        `algorithm.precision` (`alight.backends.precision`), a prompt rows share once."""
        with autocast(self.device, self.precision):
            return response_log_probs(
                model or self.model,
                batch.to(self.device),
                temperature=self.temperature,
                chunk_tokens=self.cfg.log_prob_chunk,
                entropy=entropy,
                share_prompts=self.cfg.share_prompts,
            )

    def _reference_log_probs(self, batch: TransitionBatch) -> torch.Tensor:
        import torch

        with torch.no_grad():
            if self.reference is not None:
                return self.log_probs(batch, self.reference)[0]
            with self.model.disable_adapter():
                return self.log_probs(batch)[0]

    def fill_old_log_probs(self, batch: TransitionBatch) -> None:
        """Rows recorded without the engine's log-probs get the current policy's (before any update)."""
        missing = (~batch.has_old_log_probs).nonzero().flatten().tolist()
        if not missing:
            return
        fill_log_probs(batch.old_log_probs, batch, missing, self._micro_batch_size(batch), self.log_probs)
        batch.has_old_log_probs[:] = True

    def fill_proximal_log_probs(self, batch: TransitionBatch) -> None:
        """Stale rows (async training) get the current policy's log-probs (before any update) as
        their proximal anchor; fresh rows keep their behaviour log-probs. No stale row: nothing.
        `update` calls it only when it takes several optimizer steps (see there)."""
        if batch.stale is None or not bool(batch.stale.any()):
            return
        proximal = batch.old_log_probs.clone()
        stale = batch.stale.nonzero().flatten().tolist()
        fill_log_probs(proximal, batch, stale, self._micro_batch_size(batch), self.log_probs)
        batch.proximal_log_probs = proximal

    # -- updates --------------------------------------------------------------------------------
    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One RL update on `batch` (its advantages set); metrics under actor/ names.

        A micro-batch whose loss has no gradient (every advantage 0, no KL and no entropy term) is
        not run; an optimizer step all of whose micro-batches were skipped is skipped too (AdamW
        would still move the weights by momentum and weight decay) and does not advance the
        learning-rate schedule. `actor/skipped_micro_batches` and `actor/skipped_steps` count them.
        Stale rows (async) train against their proximal log-probs: with one optimizer step, their own
        detached log-probs in that step's forward (the weights before it); otherwise a forward pass
        before the first step (`fill_proximal_log_probs`)."""
        import torch

        if self.objective.loss == "nll":
            keep = (batch.rewards >= self.objective.min_reward).nonzero().flatten().tolist()
            if not keep:
                return {"actor/sft_rows": 0.0}
            return {**self.supervised_step(batch.select(keep)), "actor/sft_rows": float(len(keep))}
        rows = len(batch)
        mini = min(self.cfg.mini_batch_size or rows, rows)
        epochs = self.objective.epochs
        if not self._has_gradient(batch):  # nothing to learn: no forward, no step
            micro = self._micro_batch_size(batch)
            return skipped_update_metrics(rows, mini, micro, epochs, self._optimization().lr)
        # rows whose behaviour log-probs the engine recorded (fresh ones): the first optimizer step's
        # forward runs on the weights that served them, so it measures the engine-trainer gap for free
        engine_rows = batch.has_old_log_probs if batch.stale is None else batch.has_old_log_probs & ~batch.stale
        batch.meta[ENGINE_ROWS] = engine_rows.tolist()
        self._gap = [0.0, 0.0, 0.0]  # sum, max, tokens
        self.fill_old_log_probs(batch)
        if mini < rows or epochs > 1:  # later optimizer steps need the anchor from before the first
            self.fill_proximal_log_probs(batch)
        # else one optimizer step: every forward runs on the weights before it, so each stale row's
        # proximal log-probs are its own (detached) log-probs in `_policy_step`: no extra forward
        sums: dict[str, float] = {}
        steps = skipped_steps = skipped_micro = 0
        forwarded = 0.0
        for _ in range(epochs):
            order = (
                torch.randperm(rows, generator=self.generator) if (mini < rows or epochs > 1) else torch.arange(rows)
            )
            for start in range(0, rows, mini):
                result = self._policy_step(batch.select(order[start : start + mini]), measure_gap=steps == 0)
                skipped_micro += int(result.pop("skipped_micro_batches"))
                forwarded += result.pop("forwarded_tokens")
                if result.pop("skipped_step"):
                    skipped_steps += 1
                    continue
                for key, value in result.items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
        del batch.meta[ENGINE_ROWS]
        metrics = {key: value / steps for key, value in sums.items()} if steps else {}
        metrics["actor/optimizer_steps"] = float(steps)
        if self._gap[2]:
            metrics["actor/logprob_gap_mean"] = self._gap[0] / self._gap[2]
            metrics["actor/logprob_gap_max"] = self._gap[1]
        metrics["actor/skipped_steps"] = float(skipped_steps)
        metrics["actor/skipped_micro_batches"] = float(skipped_micro)
        metrics["actor/update_tokens"] = forwarded
        return metrics

    def _has_gradient(self, batch: TransitionBatch) -> bool:
        """Whether the RL loss on `batch` can have a gradient (a non-zero advantage on a loss token,
        or a KL or entropy term)."""
        if self.cfg.kl_coef != 0 or self.cfg.entropy_coef != 0:
            return True
        return bool((batch.row_advantages[batch.response_mask.sum(-1) > 0] != 0).any())

    # -- memory ---------------------------------------------------------------------------------
    def _pending_bytes(self) -> int:
        return memory.pending_bytes(self.shape, optimizer_started=self._optimization().started)

    def _micro_batch_size(self, batch: TransitionBatch) -> int:
        """Rows per forward/backward: the configured number, or with "auto" the most rows of this
        batch's width that fit `memory_fraction` of the free memory (at least 1)."""
        if self.cfg.micro_batch_size != AUTO:
            return int(self.cfg.micro_batch_size)
        width = int(batch.input_ids.shape[1])
        return self._auto.rows(self.shape, len(batch), width, fixed=self._pending_bytes())

    def _policy_step(self, mini: TransitionBatch, *, measure_gap: bool = False) -> dict[str, float]:
        """One optimizer step on `mini`; with `measure_gap` (the first step of an update, on the
        weights that served the rows) the engine-trainer log-prob gap of its engine rows is added
        to `self._gap`."""
        normaliser = float(mini.response_mask.sum()) if self.cfg.loss_agg == "token_mean" else float(len(mini))
        sums = StepSums()
        skipped = forwarded = 0
        ran_tokens = 0.0
        for micro in mini.split(self._micro_batch_size(mini)):
            if not self._has_gradient(micro):  # its loss is 0 with no gradient: it adds nothing
                skipped += 1
                continue
            forwarded += 1
            ran_tokens += float((micro.prompt_lengths + micro.response_lengths).sum())
            micro = micro.to(self.device)
            log_probs, token_entropy = self.log_probs(micro, entropy=True)
            assert token_entropy is not None
            if measure_gap and ENGINE_ROWS in micro.meta:
                self._gap = add_log_prob_gap(self._gap, log_probs, micro, micro.meta[ENGINE_ROWS])
            loss = micro_batch_loss(
                micro,
                log_probs,
                token_entropy,
                self.cfg,
                normaliser=normaliser,
                reference_log_probs=self._reference_log_probs,
                sums=sums,
            )
            loss.backward()  # type: ignore[no-untyped-call]
            sums.loss += float(loss.detach())
        done = {"skipped_micro_batches": float(skipped), "forwarded_tokens": ran_tokens}
        optimization = self._optimization()
        if not forwarded:  # no gradient at all: AdamW would still move the weights (momentum, decay)
            optimization.zero_grad()
            return {**done, "skipped_step": 1.0}
        lr = optimization.lr
        grad_norm = optimization.step()
        return {**done, "skipped_step": 0.0, **sums.metrics(), "actor/grad_norm": grad_norm, "actor/lr": lr}

    def supervised_step(self, batch: TransitionBatch) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the batch's response tokens."""
        return self._supervised_step(batch, self._optimization())

    def _supervised_step(self, batch: TransitionBatch, optimization: Optimization) -> dict[str, float]:
        normaliser = float(batch.response_mask.sum()) if self.cfg.loss_agg == "token_mean" else float(len(batch))
        total = 0.0
        for micro in batch.split(self._micro_batch_size(batch)):
            log_probs, _ = self.log_probs(micro)
            loss = losses.nll_loss(
                log_probs, micro.response_mask.to(self.device), self.cfg.loss_agg, normaliser=normaliser
            )
            loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
        lr = optimization.lr
        return {"actor/loss": total, "actor/grad_norm": optimization.step(), "actor/lr": lr}

    def warm_start(
        self,
        batches: Iterator[TransitionBatch],
        *,
        steps: int,
        lr: float,
        warmup_steps: int,
        on_progress: Callable[[int, float], None] | None = None,
    ) -> float:
        """Supervised fine-tuning for `steps` optimizer steps on `batches` with its own AdamW (the
        RL optimizer starts fresh afterwards). Returns the mean loss of the last 50 steps."""
        warm = self._optimization_for(lr, warmup_steps)
        recent: list[float] = []
        for step in range(1, steps + 1):
            loss = self._supervised_step(next(batches), warm)["actor/loss"]
            recent = [*recent[-49:], loss]
            if on_progress is not None:
                on_progress(step, sum(recent) / len(recent))
        self._optimization().zero_grad()
        if self.reference is not None:  # the KL anchor is the warm-started policy
            self.reference.load_state_dict(self.model.state_dict())
        return sum(recent) / len(recent) if recent else math.nan

    # -- weights and checkpoints ------------------------------------------------------------------
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """The full weights for the engine: a detached CPU copy (LoRA adapters merged in)."""
        if self.lora:
            return merged_weights(self.model)
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def save(self, directory: Path) -> None:
        """Write the policy (a servable Hugging Face model directory), adapters and optimizer state."""
        checkpoint.write_model(
            self.model.get_base_model() if self.lora else self.model, directory, self.engine_weights()
        )
        if self.lora:
            save_adapters(self.model, directory / ADAPTER_DIR)
        optimizer, scheduler = self._optimization().state_dict()
        state = {"optimizer": optimizer, "scheduler": scheduler, "generator": self.generator.get_state()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        checkpoint.write_state(directory, state)

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote (policy, adapters, optimizer, scheduler, reference, RNG)."""
        if self.lora:
            load_adapter(self.model, directory / ADAPTER_DIR)
        else:
            checkpoint.load_weights(self.model, directory)
        state = checkpoint.read_state(directory, self.device)
        self._optimization().load_state_dict(state["optimizer"], state["scheduler"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())
