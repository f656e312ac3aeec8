"""Checkpoints of a run: `checkpoints/step_NNNNNN/` in the run directory.

Each holds the policy as a servable Hugging Face model directory (weights, config, tokenizer: what
`alight serve` and the engine load), the optimizer state, the RNG states and `trainer_state.json`
(step, data position, weights version). A checkpoint is written under a temporary name and renamed
into place, so a run killed while saving leaves the previous checkpoint whole; a disk that fills
while saving ends the run with one line (TrainingError), the half-written one removed and the
previous one whole.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from alight.errors import ConfigError, TrainingError

if TYPE_CHECKING:
    from alight.backends.base import Backend

CHECKPOINTS = "checkpoints"
FULL_BELOW_BYTES = 8 << 20  # a failed write in a folder with less room than this ran into a full disk
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step_{step:06d}"


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of the run, oldest first."""
    root = run_dir / CHECKPOINTS
    found = []
    for path in root.glob("step_*") if root.is_dir() else ():
        if (path / STATE_FILE).is_file():
            try:
                found.append((int(path.name.removeprefix("step_")), path))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global RNGs (what `rng_state` saves)."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(extra: Any = None) -> dict[str, Any]:
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "extra": extra,
    }


def restore_rng(state: dict[str, Any]) -> Any:
    """Restore the global RNGs; returns the `extra` state saved with them."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    return state.get("extra")


def save_checkpoint(
    run_dir: Path,
    step: int,
    backend: Backend,
    state: dict[str, Any],
    *,
    tokenizer_dir: Path,
    rng: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint `step` (backend weights + optimizer, tokenizer, RNG, trainer state) atomically
    and keep only the newest `keep` checkpoints (at least this one)."""
    import torch

    final = step_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        backend.save(tmp)
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, tmp / name)
        torch.save(rng, tmp / RNG_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2) + "\n")
    except Exception as err:
        full = disk_full(err, tmp.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written checkpoint only takes the room away
        if not full:
            raise
        previous = latest_checkpoint(run_dir)
        kept = f"{previous[1]} is whole: make room, then --resume" if previous else "no earlier checkpoint is kept"
        raise TrainingError(f"the checkpoint of step {step} could not be written: {full}; {kept}") from None
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoints(run_dir)[: -max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def disk_full(err: BaseException, folder: Path) -> str | None:
    """What a write that failed with `err` in `folder` ran into when it is a full disk (or quota),
    in a few words; None for any other failure. torch and safetensors wrap the OS error in their
    own exception types (often without its text), so a folder left without room counts too."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{os.strerror(err.errno)} in {folder}"
    if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
        return f"No space left on device in {folder}"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"No space left on device in {folder} ({free >> 10} KiB free)" if free < FULL_BELOW_BYTES else None


def load_state(checkpoint: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer state, RNG state) of a checkpoint directory."""
    import torch

    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
        rng = torch.load(checkpoint / RNG_FILE, weights_only=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"checkpoint {checkpoint} cannot be read: {err}") from None
    return state, rng
