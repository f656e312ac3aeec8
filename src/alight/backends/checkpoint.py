"""What the embedded backends write into a checkpoint directory and read back from it.

A checkpoint is a servable Hugging Face model directory (config + safetensors weights), plus
`optimizer.pt`: the optimizer and learning-rate schedule state(s), the backend's RNG state and
(with a KL reference) the reference's weights. LoRA adds peft adapter folders beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from alight.errors import ConfigError

OPTIMIZER_FILE = "optimizer.pt"


def write_model(model: Any, directory: Path, weights: Mapping[str, Any]) -> None:
    """`model`'s config with `weights` as a servable model directory."""
    from alight.models.progress import progress_bars_off

    directory.mkdir(parents=True, exist_ok=True)
    with progress_bars_off():
        model.save_pretrained(directory, state_dict=weights)


def load_weights(model: Any, directory: Path, plain: Callable[[str], str] = str) -> None:
    """Copy the weights of a checkpoint directory into `model`, whose non-LoRA state-dict keys
    `plain` maps to the saved names; ConfigError when they do not match (a tied lm_head is not saved)."""
    from safetensors.torch import load_file

    own = {plain(k): k for k in model.state_dict() if "lora_" not in k}
    weights: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    unknown = sorted(set(weights) - set(own))
    missing = sorted(k for k in set(own) - set(weights) if "lm_head" not in k)
    if unknown or missing:
        raise ConfigError(
            f"checkpoint {directory} does not match the model: missing {missing[:3]}, unexpected {unknown[:3]}"
        )
    model.load_state_dict({own[k]: v for k, v in weights.items()}, strict=False)


def write_state(directory: Path, state: Mapping[str, Any]) -> None:
    """The optimizer, schedule and RNG state `load` restores."""
    import torch

    torch.save(dict(state), directory / OPTIMIZER_FILE)


def read_state(directory: Path, device: Any) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(directory / OPTIMIZER_FILE, map_location=device, weights_only=False)
    return state
