"""Loading an experiment: a YAML file, checked against the schema, with Hydra overrides applied."""

from __future__ import annotations

import dataclasses
import difflib
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from alight.config.paths import resolve_paths
from alight.config.schema import SCHEMA_NAME, ExperimentConfig, register
from alight.errors import ConfigError, one_line
from alight.shipped import find_config

_MAIN_NAME = "__alight_main__"
#: What a config must say about its agent.
AGENT_CHOICE = "set exactly one of agent.entrypoint ('module:function') and agent.command (a program to run)"
_lock = threading.Lock()  # Hydra's compose API keeps global state


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `path` (a config file, or a shipped experiment's name: `calc`) over the schema and
    apply `key=value` overrides (Hydra syntax). Relative input paths become absolute: those the
    file writes against its folder, those the overrides give against the current one
    (`alight.config.paths`).

    Unknown keys, wrong types and missing required values raise a one-line ConfigError that names
    them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    file = find_config(path)
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist")
    if file.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"config file {file} is not a .yaml file")
    register()
    # before Hydra: its hint for an unknown key (`+key=...`) leads to a second error
    overridden = _check_keys(file, overrides)
    with _lock:
        # The experiment file extends the schema: keys it sets are checked against it.
        ConfigStore.instance().store(name=_MAIN_NAME, node={"defaults": [SCHEMA_NAME, file.stem, "_self_"]})
        try:
            with initialize_config_dir(config_dir=str(file.resolve().parent), version_base="1.3"):
                cfg = compose(config_name=_MAIN_NAME, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException, ValueError, YAMLError) as err:
            raise ConfigError(f"config {file}: {_one_line(err)}") from None
    # `+key=value` overrides may add keys Hydra does not check against the schema.
    unknown = _unknown_keys(cfg, ExperimentConfig)
    if unknown:
        raise ConfigError(f"config {file}: {_unknown_key(*unknown[0])}")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config {file}: required value missing: {', '.join(missing)}")
    if (cfg.agent.entrypoint is None) == (cfg.agent.command is None):
        raise ConfigError(f"config {file}: {AGENT_CHOICE}")
    try:
        resolve_paths(cfg, file.resolve().parent, overridden)
    except ConfigError as err:
        raise ConfigError(f"config {file}: {err}") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _check_keys(file: Path, overrides: Sequence[str]) -> set[str]:
    """Raise a ConfigError naming the first unknown key the file or an override sets, and the nearest
    known ones; return the dotted keys the overrides set.

    What does not parse is left to Hydra, which reports it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        raw = OmegaConf.load(file)
    except (OmegaConfBaseException, ValueError, YAMLError):
        raw = None
    if isinstance(raw, DictConfig):
        unknown = [found for found in _unknown_keys(raw, ExperimentConfig) if found[0] not in _HYDRA_KEYS]
        if unknown:
            raise ConfigError(f"config {file}: {_unknown_key(*unknown[0])}")
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return set()  # Hydra reports it
    for override in parsed:
        found = _unknown_path(override.key_or_group.split("."), ExperimentConfig)
        if found is not None:
            raise ConfigError(f"config {file}: override {override.input_line!r}: {_unknown_key(*found)}")
    return {override.key_or_group for override in parsed}


_HYDRA_KEYS = ("defaults", "hydra")  # top-level keys an experiment file may hold for Hydra itself


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> list[tuple[str, type]]:
    """Keys of `node` that the dataclass `schema` (recursively) does not declare, each with its group's schema."""
    unknown: list[tuple[str, type]] = []
    for key in node:
        path = f"{prefix}{key}"
        if str(key) not in _field_names(schema):
            unknown.append((path, schema))
            continue
        sub = _group(schema, str(key))
        if sub is not None and isinstance(node[key], DictConfig):
            unknown.extend(_unknown_keys(node[key], sub, f"{path}."))
    return unknown


def _unknown_path(parts: list[str], schema: type) -> tuple[str, type] | None:
    """The first prefix of the dotted key `parts` that `schema` does not declare, with its group's schema.

    Below a field that is not a group (a dict, a list, a value) the key is that field's to check."""
    for i, part in enumerate(parts):
        if part not in _field_names(schema):
            return ".".join(parts[: i + 1]), schema
        sub = _group(schema, part)
        if sub is None:
            return None
        schema = sub
    return None


def _unknown_key(path: str, schema: type) -> str:
    """`unknown key 'a.b'` and the keys of its group closest to it (or all of them when none is close)."""
    group, _, key = path.rpartition(".")
    names = _field_names(schema)
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    prefix = f"{group}." if group else ""
    if near:
        hint = "did you mean " + " or ".join(repr(prefix + name) for name in near) + "?"
    else:
        hint = f"{group}'s keys are: " if group else "the top-level keys are: "
        hint += ", ".join(names)
    return f"unknown key {path!r}; {hint}"


def _field_names(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def _group(schema: type, name: str) -> type | None:
    """The dataclass of the group `schema.name`, or None when that field is not a group."""
    declared = next(f for f in dataclasses.fields(schema) if f.name == name)
    sub = declared.default_factory if declared.default_factory is not dataclasses.MISSING else None
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def to_object(cfg: DictConfig) -> ExperimentConfig:
    """The typed dataclass view of a loaded config."""
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, ExperimentConfig)
    return obj


def to_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML (`--cfg`)."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def _one_line(err: BaseException) -> str:
    """Hydra and OmegaConf errors span lines with full-key/object-type trailers; keep what names the problem."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [line for line in lines if not re.match(r"^(full_key|object_type|reference_type|key|value_type):", line)]
    text = " ".join(kept or lines) or type(err).__name__
    text = re.sub(r"\s*\b(full_key|object_type|reference_type|value_type)=\S+", "", text)
    text = re.sub(r"^In '[^']*': \w+ raised while composing config:\s*", "", text)
    cause = err.__cause__ or err.__context__
    if cause is not None and str(cause) and str(cause).splitlines()[0] not in text:
        text = f"{text} ({str(cause).splitlines()[0]})"
    return one_line(text)
