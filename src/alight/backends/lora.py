"""LoRA on the embedded backends' policy: the peft settings of an adapter, wrapping a model in
one, and the full weights with the adapter merged in (what the engine serves)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.config.schema import LoraConfig
from alight.errors import ConfigError
from alight.models.lora_layout import ADAPTER_FILE, plain_name

if TYPE_CHECKING:
    import torch


def peft_arguments(lora: LoraConfig) -> dict[str, Any]:
    """peft `LoraConfig` keyword arguments of one adapter (the embedded backend's, each of the
    per-agent backend's, and the engine's per-agent adapters)."""
    return {
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
        "task_type": "CAUSAL_LM",
    }


def with_lora(model: Any, lora: LoraConfig) -> Any:
    """`model` wrapped in a peft model with one adapter (peft's default name)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:  # pragma: no cover - peft is a core dependency
        raise ConfigError('algorithm.lora needs peft: pip install "peft>=0.15"') from None
    config = PeftLoraConfig(**peft_arguments(lora))
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise ConfigError(f"algorithm.lora: {str(err).splitlines()[0]}") from None


def merged_weights(model: Any) -> dict[str, torch.Tensor]:
    """The plain model's weights with the active adapter merged in: detached CPU copies; the peft
    model is left as it was, bit for bit."""
    import torch

    with torch.no_grad():
        # merge + unmerge is not exact in floating point: put the base weights back bit for bit
        bases = {k: v.detach().clone() for k, v in model.state_dict().items() if ".base_layer." in k}
        model.merge_adapter()
        try:
            return {
                plain_name(k): v.detach().to("cpu", copy=True)
                for k, v in model.state_dict().items()
                if "lora_" not in k
            }
        finally:
            model.unmerge_adapter()
            current = model.state_dict()
            for k, v in bases.items():
                current[k].copy_(v)


def save_adapters(model: Any, directory: Path, names: Iterable[str] | None = None) -> None:
    """The peft model's adapters (`names`, default: all) in peft's format under `directory`."""
    from alight.models.progress import progress_bars_off

    with progress_bars_off():
        model.save_pretrained(directory, selected_adapters=None if names is None else list(names))


def load_adapter(model: Any, directory: Path, name: str = "default") -> None:
    """Set adapter `name` of the peft model to the weights peft saved in `directory`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_FILE)), adapter_name=name)
