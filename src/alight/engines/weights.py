"""New weights for a live model: read a checkpoint, check it fits, copy it in place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alight.errors import ConfigError


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state dict in a checkpoint directory (sharded or not) or file: safetensors or PyTorch.

    Raises:
        ConfigError: the path holds no weights.
    """
    import torch
    from safetensors.torch import load_file

    source = Path(path)
    if source.is_dir():
        files = sorted(source.glob("*.safetensors")) or sorted(source.glob("pytorch_model*.bin"))
    else:
        files = [source] if source.is_file() else []
    if not files:
        raise ConfigError(f"no weights (*.safetensors or pytorch_model*.bin) at {source}")
    state: dict[str, Any] = {}
    for file in files:
        if file.suffix == ".safetensors":
            state.update(load_file(str(file)))
        else:
            state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def load_weights_into(model: Any, weights: Mapping[str, Any] | str | os.PathLike[str]) -> None:
    """Copy weights into `model`'s parameters in place (no new tensors, so references stay valid).

    Keys the state dict leaves out are allowed only for tied parameters (a saved model with tied
    embeddings has no lm_head.weight).

    Raises:
        ConfigError: a key the model does not have, a missing untied key, or a shape mismatch.
    """
    state = read_checkpoint(weights) if isinstance(weights, str | os.PathLike) else dict(weights)
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[k].data_ptr() for k in state if k in params}
    missing = sorted(k for k in set(own) - set(state) if k not in params or params[k].data_ptr() not in loaded)
    wrong = sorted(k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape))
    if unexpected or missing or wrong:
        details = [
            f"{label}: {', '.join(keys[:3])}"
            for label, keys in (("unknown", unexpected), ("missing", missing), ("wrong shape", wrong))
            if keys
        ]
        raise ConfigError(f"the weights do not fit the model ({'; '.join(details)})")
    model.load_state_dict(state, strict=False)
