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
from alight.backends import losses, memory
from alight.backends.checks import warmup_schedule
from alight.backends.chunked import chunked_head_supported, head_log_probs
from alight.backends.objective import objective
from alight.config.schema import AlgorithmConfig, ExperimentConfig, LoraConfig
from alight.errors import ConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

AUTO = "auto"  # algorithm.micro_batch_size: the most rows that fit (alight.backends.memory)
#: Prompt tokens assumed when checking that micro_batch_size fits and adapter.max_prompt_length is unset.
ASSUMED_PROMPT_TOKENS = 256
ADAPTER_DIR = "adapter"
OPTIMIZER_FILE = "optimizer.pt"


class EmbeddedBackend:
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
            engine_copy=cfg.engine.kind == "embedded" and same_device,
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
        self.device = torch.device(device)
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
            model = _with_lora(model, algorithm)
        self.model: Any = model.to(self.device)
        self.model.train()
        self.reference: Any = None
        if algorithm.kl_coef > 0 and not self.lora:  # with LoRA the reference is the model, adapters off
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = self._optimizer(algorithm.lr, algorithm.warmup_steps)
        self.shape = memory.model_shape(self.model)
        self._auto_rows: tuple[int, int] | None = None  # (row tokens, micro-batch size) last logged
        self._check_memory(engine_copy, row_tokens)

    @property
    def max_length(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def close(self) -> None:
        """Drop the model, the reference and the optimizer state (and their accelerator memory)."""
        self.model = self.reference = self.optimizer = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    # -- optimizer --------------------------------------------------------------------------------
    def _optimizer(self, lr: float, warmup_steps: int) -> Any:
        import torch

        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=lr, betas=(self.cfg.betas[0], self.cfg.betas[1]), weight_decay=self.cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(warmup_steps))
        return optimizer

    def _step(self) -> float:
        """Clip, step the optimizer and scheduler, zero the gradients; returns the gradient norm."""
        import torch

        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        else:  # a non-finite gradient would poison the weights: skip this step
            logger.warning("non-finite gradient norm: optimizer step skipped")
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # -- forward --------------------------------------------------------------------------------
    def log_probs(
        self, batch: TransitionBatch, model: Any = None, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([B, R] log-probs of the response tokens, [B, R] their entropy when asked, else None) under
        `model` (default: the policy); 0 where the response mask is 0. The output layer runs on
        chunks of `algorithm.log_prob_chunk` tokens (see `alight.backends.chunked`)."""
        batch = batch.to(self.device)
        model = model or self.model
        mask = batch.response_mask
        if self.cfg.log_prob_chunk > 0 and chunked_head_supported(model):
            hidden = model.get_decoder()(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).last_hidden_state
            r = batch.response_length
            return head_log_probs(
                hidden[:, -(r + 1) : -1],
                model.get_output_embeddings(),
                batch.responses,
                mask,
                temperature=self.temperature,
                chunk_tokens=self.cfg.log_prob_chunk,
                with_entropy=entropy,
            )
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=batch.response_length + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1]
        m = mask.float()
        if entropy:
            lp, ent = losses.log_probs_and_entropy(logits, batch.responses, self.temperature)
            return lp * m, ent * m
        return losses.token_log_probs(logits, batch.responses, self.temperature) * m, None

    def _reference_log_probs(self, batch: TransitionBatch) -> torch.Tensor:
        import torch

        with torch.no_grad():
            if self.reference is not None:
                return self.log_probs(batch, self.reference)[0]
            with self.model.disable_adapter():
                return self.log_probs(batch)[0]

    def fill_old_log_probs(self, batch: TransitionBatch) -> None:
        """Rows recorded without the engine's log-probs get the current policy's (before any update)."""
        import torch

        missing = (~batch.has_old_log_probs).nonzero().flatten().tolist()
        if not missing:
            return
        with torch.no_grad():
            micro = self._micro_batch_size(batch)
            for start in range(0, len(missing), micro):
                rows = missing[start : start + micro]
                part = batch.select(rows)
                lp = self.log_probs(part)[0].cpu() * part.response_mask
                batch.old_log_probs[rows, : part.response_length] = lp
        batch.has_old_log_probs[:] = True

    # -- updates --------------------------------------------------------------------------------
    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One RL update on `batch` (its advantages set); metrics under actor/ names.

        A micro-batch whose loss has no gradient (every advantage 0, no KL and no entropy term) is
        not run; an optimizer step all of whose micro-batches were skipped is skipped too (AdamW
        would still move the weights by momentum and weight decay) and does not advance the
        learning-rate schedule. `actor/skipped_micro_batches` and `actor/skipped_steps` count them."""
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
            steps = epochs * math.ceil(rows / mini)
            micros = epochs * sum(math.ceil(min(mini, rows - s) / micro) for s in range(0, rows, mini))
            return {
                "actor/optimizer_steps": 0.0,
                "actor/skipped_steps": float(steps),
                "actor/skipped_micro_batches": float(micros),
                "actor/update_tokens": 0.0,
                "actor/lr": float(self.scheduler.get_last_lr()[0]),
            }
        self.fill_old_log_probs(batch)
        sums: dict[str, float] = {}
        steps = skipped_steps = skipped_micro = 0
        forwarded = 0.0
        for _ in range(epochs):
            order = (
                torch.randperm(rows, generator=self.generator) if (mini < rows or epochs > 1) else torch.arange(rows)
            )
            for start in range(0, rows, mini):
                result = self._policy_step(batch.select(order[start : start + mini]))
                skipped_micro += int(result.pop("skipped_micro_batches"))
                forwarded += result.pop("forwarded_tokens")
                if result.pop("skipped_step"):
                    skipped_steps += 1
                    continue
                for key, value in result.items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
        metrics = {key: value / steps for key, value in sums.items()} if steps else {}
        metrics["actor/optimizer_steps"] = float(steps)
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
        """What an update still allocates beyond what is in memory now: gradients, and AdamW's
        moments until its first step has made them."""
        states = 0 if self.optimizer is not None and self.optimizer.state else memory.ADAMW_STATES
        return memory.FLOAT * self.shape.trainable * (1 + states)

    def _check_memory(self, engine_copy: bool, row_tokens: int | None) -> None:
        """ConfigError, before the first step, when the update cannot fit the free memory."""
        cfg, free = self.cfg, memory.available_bytes(str(self.device))
        pending = self._pending_bytes() + (memory.FLOAT * self.shape.params if engine_copy else 0)
        if pending > free:
            raise ConfigError(
                f"training {self.model_path.name} needs {memory.gib(pending)} more for gradients, AdamW state"
                f"{' and the engine' if engine_copy else ''} but {memory.gib(free)} is free; "
                "use algorithm.lora.enabled=true or a smaller model"
            )
        if cfg.micro_batch_size == AUTO or row_tokens is None:
            return
        rows = int(cfg.micro_batch_size)
        need = memory.micro_batch_bytes(
            self.shape, rows, row_tokens, chunk_tokens=cfg.log_prob_chunk, checkpointing=cfg.gradient_checkpointing
        )
        if pending + need > free:
            fits = memory.fitting_micro_batch(
                self.shape,
                free,
                row_tokens,
                chunk_tokens=cfg.log_prob_chunk,
                checkpointing=cfg.gradient_checkpointing,
                fixed=pending,
            )
            raise ConfigError(
                f"algorithm.micro_batch_size={rows} needs ~{memory.gib(need)} for rows of ~{row_tokens} tokens "
                f"beside {memory.gib(pending)} for gradients and optimizer; {memory.gib(free)} is free: "
                f"set algorithm.micro_batch_size=auto (or <= {fits}) or algorithm.gradient_checkpointing=true"
            )

    def _micro_batch_size(self, batch: TransitionBatch) -> int:
        """Rows per forward/backward: the configured number, or with "auto" the most rows of this
        batch's width that fit `memory_fraction` of the free memory (at least 1)."""
        cfg = self.cfg
        if cfg.micro_batch_size != AUTO:
            return int(cfg.micro_batch_size)
        row_tokens = int(batch.input_ids.shape[1])
        budget = int(memory.available_bytes(str(self.device)) * cfg.memory_fraction)
        rows = memory.fitting_micro_batch(
            self.shape,
            budget,
            row_tokens,
            chunk_tokens=cfg.log_prob_chunk,
            checkpointing=cfg.gradient_checkpointing,
            fixed=self._pending_bytes(),
        )
        rows = max(1, min(rows, len(batch)))
        if self._auto_rows != (row_tokens, rows):
            self._auto_rows = (row_tokens, rows)
            logger.info("micro_batch_size auto: %d rows of %d tokens (%s free)", rows, row_tokens, memory.gib(budget))
        return rows

    def _policy_step(self, mini: TransitionBatch) -> dict[str, float]:
        import torch

        cfg = self.cfg
        mask_all = mini.response_mask
        normaliser = float(mask_all.sum()) if cfg.loss_agg == "token_mean" else float(len(mini))
        totals = {"loss": 0.0, "clipfrac": 0.0, "ppo_kl": 0.0, "kl": 0.0, "entropy": 0.0}
        tokens = 0.0
        skipped = forwarded = 0
        ran_tokens = 0.0
        for micro in mini.split(self._micro_batch_size(mini)):
            if not self._has_gradient(micro):  # its loss is 0 with no gradient: it adds nothing
                skipped += 1
                continue
            forwarded += 1
            ran_tokens += float((micro.prompt_lengths + micro.response_lengths).sum())
            micro = micro.to(self.device)
            mask = micro.response_mask
            tokens += float(mask.sum())
            log_probs, token_entropy = self.log_probs(micro, entropy=True)
            assert token_entropy is not None
            if cfg.entropy_coef == 0:
                token_entropy = token_entropy.detach()
            pg, clipped, approx_kl = losses.clipped_policy_loss(
                log_probs, micro.old_log_probs, micro.advantages, cfg.clip_ratio_low, cfg.clip_ratio_high
            )
            loss = losses.aggregate(pg, mask, cfg.loss_agg, normaliser=normaliser)
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * losses.aggregate(
                    token_entropy, mask, cfg.loss_agg, normaliser=normaliser
                )
            if cfg.kl_coef:
                kl = losses.kl_penalty(log_probs, self._reference_log_probs(micro), cfg.kl_estimator)
                loss = loss + cfg.kl_coef * losses.aggregate(kl, mask, cfg.loss_agg, normaliser=normaliser)
                totals["kl"] += float((kl.detach() * mask).sum())
            loss.backward()  # type: ignore[no-untyped-call]
            totals["loss"] += float(loss.detach())
            m = mask.to(torch.float32)
            totals["clipfrac"] += float((clipped * m).sum())
            totals["ppo_kl"] += float((approx_kl.detach() * m).sum())
            totals["entropy"] += float((token_entropy.detach() * m).sum())
        done = {"skipped_micro_batches": float(skipped), "forwarded_tokens": ran_tokens}
        if not forwarded:  # no gradient at all: AdamW would still move the weights (momentum, decay)
            self.optimizer.zero_grad(set_to_none=True)
            return {**done, "skipped_step": 1.0}
        lr = float(self.scheduler.get_last_lr()[0])
        grad_norm = self._step()
        per_token = max(tokens, 1.0)  # the metrics average the tokens that ran
        return {
            **done,
            "skipped_step": 0.0,
            "actor/loss": totals["loss"],
            "actor/pg_clipfrac": totals["clipfrac"] / per_token,
            "actor/ppo_kl": totals["ppo_kl"] / per_token,
            "actor/kl": totals["kl"] / per_token,
            "actor/entropy": totals["entropy"] / per_token,
            "actor/grad_norm": grad_norm,
            "actor/lr": lr,
        }

    def supervised_step(self, batch: TransitionBatch) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the batch's response tokens."""
        normaliser = float(batch.response_mask.sum()) if self.cfg.loss_agg == "token_mean" else float(len(batch))
        total = 0.0
        for micro in batch.split(self._micro_batch_size(batch)):
            log_probs, _ = self.log_probs(micro)
            loss = losses.nll_loss(
                log_probs, micro.response_mask.to(self.device), self.cfg.loss_agg, normaliser=normaliser
            )
            loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
        lr = float(self.scheduler.get_last_lr()[0])
        return {"actor/loss": total, "actor/grad_norm": self._step(), "actor/lr": lr}

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
        rl_optimizer, rl_scheduler = self.optimizer, self.scheduler
        self.optimizer = self._optimizer(lr, warmup_steps)
        recent: list[float] = []
        try:
            for step in range(1, steps + 1):
                loss = self.supervised_step(next(batches))["actor/loss"]
                recent = [*recent[-49:], loss]
                if on_progress is not None:
                    on_progress(step, sum(recent) / len(recent))
        finally:
            self.optimizer, self.scheduler = rl_optimizer, rl_scheduler
        self.optimizer.zero_grad(set_to_none=True)
        if self.reference is not None:  # the KL anchor is the warm-started policy
            self.reference.load_state_dict(self.model.state_dict())
        return sum(recent) / len(recent) if recent else math.nan

    # -- weights and checkpoints ------------------------------------------------------------------
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """The full weights for the engine: a detached CPU copy (LoRA adapters merged in)."""
        import torch

        with torch.no_grad():
            if not self.lora:
                return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            # merge + unmerge is not exact in floating point: put the base weights back bit for bit
            bases = {k: v.detach().clone() for k, v in self.model.state_dict().items() if ".base_layer." in k}
            self.model.merge_adapter()
            try:
                return {
                    _base_name(k): v.detach().to("cpu", copy=True)
                    for k, v in self.model.state_dict().items()
                    if "lora_" not in k
                }
            finally:
                self.model.unmerge_adapter()
                current = self.model.state_dict()
                for k, v in bases.items():
                    current[k].copy_(v)

    def save(self, directory: Path) -> None:
        """Write the policy (a servable Hugging Face model directory), adapters and optimizer state."""
        import torch

        from alight.models.progress import progress_bars_off

        directory.mkdir(parents=True, exist_ok=True)
        base = self.model.get_base_model() if self.lora else self.model
        with progress_bars_off():
            base.save_pretrained(directory, state_dict=self.engine_weights())
            if self.lora:
                self.model.save_pretrained(directory / ADAPTER_DIR)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, directory / OPTIMIZER_FILE)

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote (policy, adapters, optimizer, scheduler, reference, RNG)."""
        import torch
        from safetensors.torch import load_file

        if self.lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, load_file(str(directory / ADAPTER_DIR / "adapter_model.safetensors")))
        else:
            weights = {}
            for path in sorted(directory.glob("*.safetensors")):
                weights.update(load_file(str(path)))
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if [k for k in missing if "lm_head" not in k] or unexpected:  # tied lm_head is not saved
                raise ConfigError(
                    f"checkpoint {directory} does not match the model: "
                    f"missing {missing[:3]}, unexpected {unexpected[:3]}"
                )
        state = torch.load(directory / OPTIMIZER_FILE, map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())


def _with_lora(model: Any, algorithm: AlgorithmConfig) -> Any:
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:  # pragma: no cover - peft is a core dependency
        raise ConfigError('algorithm.lora needs peft: pip install "peft>=0.15"') from None
    config = PeftLoraConfig(**peft_arguments(algorithm.lora))
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise ConfigError(f"algorithm.lora: {str(err).splitlines()[0]}") from None


def peft_arguments(lora: LoraConfig) -> dict[str, Any]:
    """peft `LoraConfig` keyword arguments of one adapter (this backend's, the per-agent backend's
    and the engine's per-agent adapters)."""
    return {
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
        "task_type": "CAUSAL_LM",
    }


def _base_name(key: str) -> str:
    """A peft state-dict key as the plain model names it."""
    key = key.removeprefix("base_model.model.")
    return key.replace(".base_layer.", ".")
