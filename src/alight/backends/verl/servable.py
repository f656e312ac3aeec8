"""A servable Hugging Face model directory from a full state dict (what vLLM and `alight serve` load).

verl's actor gathers the full weights from its FSDP shards (LoRA merged) on rank 0 and hands them
here: `config.json`, `generation_config.json` (when the base model has one) and safetensors shards
(one file up to `max_shard_size`, an index beside several), written in the model's own dtype.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Weight files a previous export may have left (removed before writing, so no stale shard stays).
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")
INDEX_FILE = "model.safetensors.index.json"


def write_hf_model(
    state: Mapping[str, torch.Tensor],
    hf_config: Any,
    directory: Path,
    *,
    base_dir: Path | None = None,
    max_shard_size: str = "5GB",
) -> None:
    """Write `state` (Hugging Face parameter names) and `hf_config` as a model directory.

    Floating-point tensors are cast to the config's dtype (bfloat16 when it names none); a tied
    `lm_head.weight` is left out, as `save_pretrained` does; `generation_config.json` is copied
    from `base_dir` when it has one."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    dtype = _dtype(hf_config)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tied and name == "lm_head.weight":
            continue
        value = tensor.detach().to("cpu")
        tensors[name] = (value.to(dtype) if value.is_floating_point() else value).contiguous()
    for pattern in WEIGHT_FILES:
        for old in directory.glob(pattern):
            old.unlink()
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        tmp = directory / f".{filename}.tmp"
        save_file({name: tensors[name] for name in names}, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, directory / filename)
    if split.is_sharded:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": split.tensor_to_filename}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    hf_config.save_pretrained(directory)
    if base_dir is not None and (base_dir / "generation_config.json").is_file():
        shutil.copy2(base_dir / "generation_config.json", directory / "generation_config.json")


def _dtype(hf_config: Any) -> torch.dtype:
    import torch

    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)  # type: ignore[no-any-return]
    return torch.bfloat16
