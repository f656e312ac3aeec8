"""How a model directory holds per-agent LoRA adapters: what the trainer's per-agent backend writes
and the embedded engine reads (both import it from here).

A checkpoint is a servable base model directory plus `adapters/{agent}/`, one peft adapter folder
per agent (`adapter_model.safetensors` and its config). Adapter names become model names
(`policy/writer`) and peft module keys, so they are plain words.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from alight.errors import ConfigError

#: The folder of a model directory that holds one peft adapter folder per agent.
ADAPTERS_DIR = "adapters"
#: The weights file of one adapter folder (peft's name).
ADAPTER_FILE = "adapter_model.safetensors"
#: Adapter (agent) names: they become model names (`policy/writer`) and peft module keys.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9_-]+")


def check_adapter_names(names: list[str], what: str = "adapters") -> None:
    """ConfigError, in one line, for an empty, repeated or unusable adapter name."""
    if not names:
        raise ConfigError(f"{what} is empty: name the agents that get an adapter, e.g. [writer, rewriter]")
    bad = [n for n in names if not isinstance(n, str) or not ADAPTER_NAME.fullmatch(n) or n == "default"]
    if bad:
        raise ConfigError(f"{what}: {bad[0]!r} is not a usable adapter name (letters, digits, _ and -; not 'default')")
    if len(set(names)) != len(names):
        raise ConfigError(f"{what} names an agent twice: {names}")


def saved_adapters(model_dir: str | os.PathLike[str]) -> list[str]:
    """The agents whose adapters a model directory holds (`adapters/{agent}/`), sorted."""
    root = Path(model_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / ADAPTER_FILE).is_file())


def adapter_file(model_dir: str | os.PathLike[str], agent: str) -> Path:
    """The weights file of `agent`'s adapter in a model directory."""
    return Path(model_dir) / ADAPTERS_DIR / agent / ADAPTER_FILE


def plain_name(key: str) -> str:
    """A peft model's state-dict key as the plain model names it."""
    return key.removeprefix("base_model.model.").replace(".base_layer.", ".")


def adapter_key(key: str, agent: str) -> bool:
    """Whether a peft state-dict key is a tensor of `agent`'s adapter (`...lora_A.{agent}.weight`)."""
    parts = key.split(".")
    return any(part.startswith("lora_") and parts[i + 1 : i + 2] == [agent] for i, part in enumerate(parts))
