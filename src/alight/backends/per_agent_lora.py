"""Per-agent LoRA (`algorithm.lora.per_agent: true`): one adapter per agent on a shared base model.

Each agent named in `algorithm.lora.agents` gets its own peft adapter on the shared base and its
own AdamW and learning-rate schedule (an `Optimization` in `optimizers`, by agent): an agent's
warm-up advances only on its own updates. An update splits the `TransitionBatch` by the rows'
`agent_name` and updates each adapter from its own rows only, with the embedded backend's loss;
an adapter with no rows in the batch is not touched at all (no forward, no optimizer step, no
weight decay: bit for bit unchanged). Rows of agents without an adapter are skipped (their calls
were answered by the base model, which stays frozen) and counted in `actor/rows_without_adapter`.

Warm start trains every weight of the base model, before the adapters exist (they are added on
the first update, checkpoint or weight export); the KL reference is that warm-started base with
the adapters disabled. `engine_weights()` hands the engine every adapter's tensors, named as in
the peft model (the engine builds the same adapters, see `alight.engines.agent_adapters`); a
checkpoint holds the base as a servable model directory plus `adapters/{agent}/` (peft's format,
laid out as `alight.models.lora_layout` says, which the engine reads too) and every adapter's
optimizer and schedule state. Embedded backend and engine only: the verl/vLLM path (GPUs) is not
built yet.

The factory picks this class for `trainer.backend: embedded` when `selects(cfg)` (the config sets
`algorithm.lora.per_agent`); `engine_options(cfg)` tells the stack how the engine serves the
adapters.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.algorithms.batch import TransitionBatch
from alight.backends import checkpoint
from alight.backends.embedded import EmbeddedBackend
from alight.backends.lora import load_adapter, peft_arguments, save_adapters
from alight.backends.optimization import Optimization
from alight.config.schema import AlgorithmConfig, ExperimentConfig
from alight.engines.factory import engine_class
from alight.errors import ConfigError
from alight.models.lora_layout import ADAPTERS_DIR, adapter_file, adapter_key, check_adapter_names, plain_name

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: Metrics summed over agents (the others are averaged, weighted by each agent's rows).
SUMMED = ("actor/optimizer_steps", "actor/update_tokens", "actor/skipped_steps", "actor/skipped_micro_batches")
#: Where per-agent LoRA runs today.
WHERE = "the embedded backend and engine only; the verl/vLLM path (GPUs) is not built yet"


class PerAgentLoraBackend(EmbeddedBackend):
    """The embedded backend with one LoRA adapter, one optimizer and one schedule per agent (a `Backend`)."""

    @classmethod
    def selects(cls, cfg: ExperimentConfig) -> bool:
        """This class trains the configs that set `algorithm.lora.per_agent`."""
        return cfg.algorithm.lora.per_agent

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """ConfigError, in one line, for per-agent LoRA settings that cannot run."""
        super().check_config(cfg)
        lora = cfg.algorithm.lora
        if not engine_class(cfg.engine.kind).capabilities.adapters:
            raise ConfigError(f"algorithm.lora.per_agent: not yet with engine.kind={cfg.engine.kind} ({WHERE})")
        if not lora.agents:
            raise ConfigError("algorithm.lora.per_agent needs algorithm.lora.agents: the agents that get an adapter")
        if cfg.data.from_store is not None:
            raise ConfigError(
                "algorithm.lora.per_agent: not with data.from_store (fine-tune one adapter: lora.enabled)"
            )
        check_adapter_names(list(lora.agents), "algorithm.lora.agents")
        if lora.r < 1 or lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules:
            raise ConfigError("algorithm.lora: r must be >= 1, alpha > 0, dropout in [0, 1), target_modules not empty")

    @classmethod
    def engine_options(cls, cfg: ExperimentConfig) -> dict[str, Any]:
        """The embedded engine serves one adapter per agent, built as this backend builds them."""
        return {"adapters": list(cfg.algorithm.lora.agents), "lora": peft_arguments(cfg.algorithm.lora)}

    def __init__(
        self,
        model_path: str | Path,
        algorithm: AlgorithmConfig,
        *,
        device: str = "cpu",
        temperature: float = 1.0,
        seed: int = 0,
        engine_copy: bool = False,  # as EmbeddedBackend: the engine holds another copy on this device
        row_tokens: int | None = None,  # as EmbeddedBackend: the longest rows expected (memory check)
    ) -> None:
        self.optimizers: dict[str, Optimization] = {}  # agent -> its AdamW and schedule (once attached)
        # The parent loads the plain model (warm start trains all of it); no deep-copied reference:
        # the reference is the base with the adapters disabled.
        plain = dataclasses.replace(
            algorithm,
            kl_coef=0.0,
            lora=dataclasses.replace(algorithm.lora, enabled=False, per_agent=False, agents=[]),
        )
        super().__init__(
            model_path,
            plain,
            device=device,
            temperature=temperature,
            seed=seed,
            engine_copy=engine_copy,
            row_tokens=row_tokens,
        )
        self.cfg = algorithm
        self.agents = list(algorithm.lora.agents)
        if not self.agents:
            raise ConfigError("algorithm.lora.per_agent needs algorithm.lora.agents: the agents that get an adapter")
        self._warned: set[str] = set()

    # -- the adapters -----------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self.optimizers)

    def _optimization(self) -> Optimization:
        """The active adapter's optimizer and schedule (before the adapters exist: the full-weight one)."""
        if not self.attached:
            return super()._optimization()
        return self.optimizers[self.model.active_adapter]

    def close(self) -> None:
        super().close()
        self.optimizers.clear()

    def _attach(self) -> None:
        """Add one adapter (and its optimizer) per agent to the model; idempotent."""
        if self.attached:
            return
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        arguments = peft_arguments(self.cfg.lora)
        try:
            model: Any = get_peft_model(self.model, PeftLoraConfig(**arguments), adapter_name=self.agents[0])
            for name in self.agents[1:]:
                model.add_adapter(name, PeftLoraConfig(**arguments))
        except ValueError as err:
            raise ConfigError(f"algorithm.lora: {str(err).splitlines()[0]}") from None
        self.model = model.to(self.device)
        self.model.train()
        self.lora = True  # the parent's KL reference: this model with the adapters disabled
        self.optimization = None  # the full-weight optimizer the parent made is never used from here on
        for name in self.agents:
            self.model.set_adapter(name)  # only this adapter's parameters require grad
            self.optimizers[name] = self._optimization_for(self.cfg.lr, self.cfg.warmup_steps)

    def adapter_tensors(self, agent: str) -> dict[str, torch.Tensor]:
        """The tensors of one agent's adapter (peft names), detached CPU copies."""
        self._attach()
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items() if adapter_key(k, agent)}

    # -- updates ----------------------------------------------------------------------------------
    def warm_start(
        self,
        batches: Iterator[TransitionBatch],
        *,
        steps: int,
        lr: float,
        warmup_steps: int,
        on_progress: Callable[[int, float], None] | None = None,
    ) -> float:
        """Full-weight supervised warm start of the shared base, before any adapter exists."""
        if self.attached:
            raise RuntimeError("per-agent LoRA: warm start must come before the first update")
        return super().warm_start(batches, steps=steps, lr=lr, warmup_steps=warmup_steps, on_progress=on_progress)

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """Each agent's adapter updated from its own rows, with its own optimizer; metrics per
        agent (`actor/{agent}/...`) and over all of them (`actor/...`)."""
        self._attach()
        rows: dict[str, list[int]] = {}
        skipped = 0
        for index, agent in enumerate(batch.meta["agent_name"]):
            if agent in self.optimizers:
                rows.setdefault(agent, []).append(index)
            else:
                skipped += 1
                if agent not in self._warned:
                    self._warned.add(agent)
                    logger.warning("per-agent LoRA: agent %r has no adapter; its transitions are skipped", agent)
        metrics: dict[str, float] = {"actor/rows_without_adapter": float(skipped)}
        parts: dict[str, dict[str, float]] = {}
        for agent in self.agents:  # the configured order: deterministic
            if agent not in rows:
                continue
            self.model.set_adapter(agent)  # its adapter trains, with its optimizer (`_optimization`)
            parts[agent] = super().update(batch.select(rows[agent]))
            metrics[f"actor/{agent}/rows"] = float(len(rows[agent]))
            for key, value in parts[agent].items():
                metrics[f"actor/{agent}/{key.removeprefix('actor/')}"] = value
        total = sum(len(rows[a]) for a in parts)
        keys = {key for part in parts.values() for key in part}
        for key in sorted(keys):
            values = [(len(rows[a]), part[key]) for a, part in parts.items() if key in part]
            if key in SUMMED or key == "actor/sft_rows":
                metrics[key] = sum(v for _, v in values)
            else:
                metrics[key] = sum(n * v for n, v in values) / max(sum(n for n, _ in values), 1)
        metrics.setdefault("actor/optimizer_steps", 0.0)
        metrics.setdefault("actor/update_tokens", 0.0)
        metrics["actor/agents_updated"] = float(len(parts))
        if not total:
            logger.warning("per-agent LoRA: no transition of an agent with an adapter in this batch")
        return metrics

    # -- weights and checkpoints ------------------------------------------------------------------
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """Every adapter's tensors, under the peft model's names (the base never changes here)."""
        self._attach()
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items() if "lora_" in k}

    def save(self, directory: Path) -> None:
        """The base as a servable model directory, `adapters/{agent}/`, every optimizer's and
        schedule's state."""
        self._attach()
        base = {plain_name(k): v.detach().to("cpu") for k, v in self.model.state_dict().items() if "lora_" not in k}
        checkpoint.write_model(self.model.get_base_model(), directory, base)
        save_adapters(self.model, directory / ADAPTERS_DIR, self.agents)
        states = {name: optimization.state_dict() for name, optimization in self.optimizers.items()}
        state = {
            "optimizers": {name: optimizer for name, (optimizer, _) in states.items()},
            "schedulers": {name: scheduler for name, (_, scheduler) in states.items()},
            "generator": self.generator.get_state(),
        }
        checkpoint.write_state(directory, state)

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote: base weights, every adapter, optimizer and schedule, RNG."""
        self._attach()
        checkpoint.load_weights(self.model, directory, plain_name)
        for name in self.agents:
            path = adapter_file(directory, name)
            if not path.is_file():
                raise ConfigError(f"checkpoint {directory} has no adapter for agent {name!r}")
            load_adapter(self.model, path.parent, name)
        state = checkpoint.read_state(directory, self.device)
        for name, optimization in self.optimizers.items():
            optimization.load_state_dict(state["optimizers"][name], state["schedulers"][name])
        self.generator.set_state(state["generator"].cpu())
