"""The `Backend` protocol: what the training loop needs from a policy-update backend.

A backend owns the trainable policy (and, for PPO with a critic, the value model) and turns
`TransitionBatch`es into updates. The loop sees only this protocol: it asks the backend to warm
start, to update on a batch, for the weights the engine serves next, to save and load a
checkpoint (RNG state included) and to close. Backends: `embedded` (PyTorch in the trainer's
process, CPU or one GPU) and `verl` (verl's FSDP workers on Ray, GPUs). A new backend is a new
module plus a line in `backends/factory.py`; what a backend class offers the factory (`selects`,
`check_config`, `engine_options`, `from_config`) is listed there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from alight.algorithms.batch import TransitionBatch
    from alight.config.schema import ExperimentConfig

#: What a backend hands the engine after an update: a state dict (name -> tensor) or a directory
#: holding a servable Hugging Face model (both are what `Engine.update_weights` takes).
EngineWeights = Mapping[str, Any] | str


@runtime_checkable
class Backend(Protocol):
    """A policy-update backend (see the module docstring)."""

    @property
    def max_length(self) -> int | None:
        """The policy's context length (warm-start demonstrations longer than it are dropped)."""
        ...

    @property
    def colocated(self) -> bool:
        """True when the update needs the engine's accelerator memory: the loop then has the
        engine release it (vLLM sleeps) for the update and take it back afterwards."""
        ...

    def warm_start(
        self,
        batches: Iterator[TransitionBatch],
        *,
        steps: int,
        lr: float,
        warmup_steps: int,
        on_progress: Callable[[int, float], None] | None = None,
    ) -> float:
        """Supervised fine-tuning for `steps` optimizer steps on `batches` before RL (the RL
        optimizer starts fresh after it); returns the mean loss of the last steps."""
        ...

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One update on `batch` (advantages set by the algorithm) with the configured objective
        (`alight.backends.objective`: the policy loss, or nll on the rows rewarded enough); metrics
        under `actor/` (and `critic/`) names, `actor/update_tokens` the tokens processed."""
        ...

    def supervised_step(self, batch: TransitionBatch) -> dict[str, float]:
        """One optimizer step of negative log-likelihood on the batch's response tokens (fine-tuning
        from a store); metrics under `actor/` names. A backend that cannot raises ConfigError."""
        ...

    def engine_weights(self) -> EngineWeights:
        """The weights the engine serves next (after `update`)."""
        ...

    def save(self, directory: Path) -> None:
        """Write a checkpoint: a servable Hugging Face model directory, plus what `load` needs to
        go on exactly (optimizer, scheduler, reference, the backend's RNG state)."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote."""
        ...

    def close(self) -> None:
        """Release workers, processes and accelerator memory."""
        ...


class FactoryDefaults:
    """What a backend class tells `alight.backends.factory` unless it says otherwise: it trains
    every config its `trainer.backend` names, and the engine serves its weights with no options of
    its own (the per-agent LoRA backend overrides both)."""

    @classmethod
    def selects(cls, cfg: ExperimentConfig) -> bool:
        """Whether this class trains `cfg`: every config its `trainer.backend` names."""
        return True

    @classmethod
    def engine_options(cls, cfg: ExperimentConfig) -> dict[str, Any]:
        """Options the engine needs to serve what this backend trains: none."""
        return {}
