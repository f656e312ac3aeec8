"""One model resolver: a model spec becomes a servable Hugging Face model directory, here only.

A spec is one of: `tiny` (alight's tiny Qwen2, built offline on first use), a packaged model's
name (smollm2-135m-instruct), a GGUF file or a directory holding one (converted once), a model
directory, a hub id (downloaded once), and, for the commands that serve what a run trained
(`checkpoints=True`), a run directory or a directory of checkpoints (the newest one). The run, the
engines and the commands call `resolve_model`; nothing else tells the tiny model apart.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from alight.errors import ConfigError

if TYPE_CHECKING:  # sources loads when a spec is resolved, not when TINY is read
    from alight.models.sources import Progress

logger = logging.getLogger(__name__)

#: The spec of alight's tiny model (the default `engine.model`).
TINY = "tiny"
#: The stage shown while the tiny model is built.
BUILDING = "building the model"


def default_cache_dir() -> Path:
    """Where alight keeps models it builds itself ($XDG_CACHE_HOME/alight or ~/.cache/alight)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alight"


def tiny_model_dir(path: str | os.PathLike[str] | None = None, *, seed: int = 0) -> Path:
    """The tiny model's directory `path` (default: the cache's), built with `seed` on first use."""
    from alight.models.tiny import build_tiny_model, is_current_tiny_model

    out = Path(path) if path is not None else default_cache_dir() / TINY
    if not is_current_tiny_model(out):
        logger.info("building the tiny model in %s", out)
        build_tiny_model(out, seed=seed)
    return out


def resolve_model(
    spec: str | os.PathLike[str],
    *,
    tiny_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    checkpoints: bool = False,
) -> Path:
    """The model directory `spec` names (see the module docstring). The tiny model is built into
    `tiny_dir` (default: the cache's) with `seed`; `progress` hears of long steps (a build, a
    conversion, a download). With `checkpoints`, a directory of training checkpoints or a run
    directory serves its newest checkpoint.

    Raises:
        ConfigError: nothing loadable is named by `spec` (one line, saying what to do).
    """
    from alight.models.sources import is_model_dir, prepare_model

    spec = str(spec)
    if spec == TINY:
        out = Path(tiny_dir) if tiny_dir is not None else default_cache_dir() / TINY
        from alight.models.tiny import is_current_tiny_model

        if progress is not None and not is_current_tiny_model(out):
            progress(BUILDING)
        return tiny_model_dir(out, seed=seed)
    path = Path(spec).expanduser()
    if checkpoints and path.is_dir() and not is_model_dir(path) and not list(path.glob("*.gguf")):
        return newest_checkpoint(path, spec)
    return prepare_model(spec, progress=progress)


def newest_checkpoint(path: Path, spec: str) -> Path:
    """The newest subdirectory of `path` (or of its `checkpoints/`, a run directory's) holding a model."""
    from alight.models.sources import is_model_dir

    if (path / "checkpoints").is_dir():  # a training run directory: its checkpoints, not its base model
        path = path / "checkpoints"
    candidates = [child for child in path.iterdir() if is_model_dir(child)]
    if not candidates:
        raise ConfigError(f"{spec} holds no model (no config.json in it or in its subdirectories)")
    newest = max(candidates, key=lambda child: (child / "config.json").stat().st_mtime)
    logger.info("serving the newest checkpoint in %s: %s", spec, newest.name)
    return newest
