"""Relative paths in a config, read one way: against the folder of the config file that wrote them.

A path written in a config file (an agent's entrypoint file or command script, task data and its
generator, demonstrations, a chat-template file, a model or tokenizer directory, a sandbox's
exposed folders) is read against that file's folder, so a config runs the same from any working
folder; a path given as a command-line override is read against the current folder, as a shell
user expects. Outputs (`trainer.output_dir`, `store.path`) stay relative to the current folder.
After loading, these fields hold absolute paths, so every process that reads the config (runners,
`--resume`) sees the same files."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from alight.errors import ConfigError

#: The rule, as every error about a missing path states it.
RULE = "relative paths in a config file are read against its folder, on the command line against the current folder"
#: Chat-template settings that are names, not files.
_TEMPLATE_NAMES = ("auto", "model", "chatml-tools")


def resolve_paths(cfg: DictConfig, config_dir: Path, overridden: Collection[str]) -> None:
    """Make `cfg`'s input paths absolute in place: against `config_dir` unless the key (or a
    group above it) is in `overridden` (set on the command line), then against the current folder."""
    for key, resolve in _FIELDS.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        base = Path.cwd() if _overridden(key, overridden) else config_dir
        resolved = resolve(value, base, key)
        if resolved != value:
            OmegaConf.update(cfg, key, resolved, merge=False)


def _overridden(key: str, overridden: Collection[str]) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in overridden for i in range(1, len(parts) + 1))


def _missing(key: str, value: str, base: Path) -> ConfigError:
    return ConfigError(f"{key}: no such file or folder {value} (read against {base}; {RULE})")


def _absolute(value: str, base: Path) -> Path:
    return (base / Path(value).expanduser()).resolve()


def _is_absolute(text: str) -> bool:
    return os.path.isabs(os.path.expanduser(text))


def _entrypoint(value: Any, base: Path, key: str) -> Any:
    """`path/to/file.py:function` with the file absolute; `package.module:function` as it is."""
    module, sep, attr = str(value).rpartition(":")
    if not sep or not (module.endswith(".py") or "/" in module) or _is_absolute(module):
        return value
    path = _absolute(module, base)
    if not path.is_file():
        raise _missing(key, module, base)
    return f"{path}:{attr}"


def _data(value: Any, base: Path, key: str) -> Any:
    """A data file or saved dataset (absolute where it exists under `base`), or a generator entrypoint."""
    text = str(value)
    if _is_absolute(text):
        return value
    if (base / text).exists():
        return str(_absolute(text, base))
    if ":" in text:  # not a file here: a generator
        return _entrypoint(value, base, key)
    raise _missing(key, text, base)


def _existing(value: Any, base: Path, key: str) -> Any:
    """Absolute where `value` names something under `base` (a model directory); else as it is (a
    name such as `tiny`, a hub id)."""
    text = str(value)
    if _is_absolute(text) or not (base / text).exists():
        return value
    return str(_absolute(text, base))


def _template(value: Any, base: Path, key: str) -> Any:
    if str(value) in _TEMPLATE_NAMES or _is_absolute(str(value)):
        return value
    path = _absolute(str(value), base)
    if not path.is_file():
        raise _missing(key, str(value), base)
    return str(path)


def _command(value: Any, base: Path, key: str) -> Any:
    """A program and its arguments: each that names a file or folder under `base` made absolute; a
    program named by a relative path (`./agent.sh`, `bin/agent`) must be there."""
    argv = shlex.split(value) if isinstance(value, str) else [str(part) for part in _plain(value)]
    if not argv:
        return value
    out = []
    for i, part in enumerate(argv):
        if part.startswith("-") or _is_absolute(part):
            out.append(part)
        elif (base / part).exists():
            out.append(str(_absolute(part, base)))
        elif i == 0 and "/" in part:
            raise _missing(key, part, base)
        else:
            out.append(part)
    return out if out != argv else value


def _folders(value: Any, base: Path, key: str) -> Any:
    out = []
    for part in _plain(value):
        text = str(part)
        if _is_absolute(text):
            out.append(text)
        elif (base / text).exists():
            out.append(str(_absolute(text, base)))
        else:
            raise _missing(key, text, base)
    return out


def _plain(value: Any) -> list[Any]:
    if isinstance(value, ListConfig):
        container = OmegaConf.to_container(value, resolve=True)
        assert isinstance(container, list)
        return container
    return list(value) if isinstance(value, list | tuple) else [value]


#: Each config key that names an input, and how its value is read.
_FIELDS: dict[str, Callable[[Any, Path, str], Any]] = {
    "agent.entrypoint": _entrypoint,
    "agent.command": _command,
    "agent.sandbox.expose": _folders,
    "data.train": _data,
    "data.val": _data,
    "warm_start.data": _data,
    "engine.model": _existing,
    "engine.tokenizer": _existing,
    "engine.chat_template": _template,
}
