"""Loading an experiment: a YAML file, checked against the schema, with Hydra overrides applied."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from alight.config.schema import SCHEMA_NAME, ExperimentConfig, register
from alight.errors import ConfigError, one_line

_MAIN_NAME = "__alight_main__"
_lock = threading.Lock()  # Hydra's compose API keeps global state


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `path` over the schema and apply `key=value` overrides (Hydra syntax).

    Unknown keys, wrong types and missing required values raise a one-line ConfigError that names
    them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist")
    if file.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"config file {file} is not a .yaml file")
    register()
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
        raise ConfigError(f"config {file}: unknown key {unknown[0]!r} (not in the experiment schema)")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config {file}: required value missing: {', '.join(missing)}")
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys of `node` that the dataclass `schema` (recursively) does not declare."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown: list[str] = []
    for key in node:
        path = f"{prefix}{key}"
        declared = fields.get(str(key))
        if declared is None:
            unknown.append(path)
            continue
        sub = declared.default_factory if declared.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub) and isinstance(node[key], DictConfig):
            unknown.extend(_unknown_keys(node[key], sub, f"{path}."))
    return unknown


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
