"""`make_engine`: an engine by kind name, for configs and the CLI (heavy imports stay lazy)."""

from __future__ import annotations

import inspect
from typing import Any

from alight.engines.base import Engine
from alight.errors import ConfigError

ENGINE_KINDS = ("embedded", "vllm", "litellm")


def _engine_class(kind: str) -> type[Engine]:
    if kind == "embedded":
        from alight.engines.embedded import EmbeddedEngine

        return EmbeddedEngine
    if kind == "vllm":
        from alight.engines.vllm_engine import VLLMEngine

        return VLLMEngine
    if kind == "litellm":
        from alight.engines.litellm_engine import LiteLLMEngine

        return LiteLLMEngine
    raise ConfigError(f"unknown engine kind {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")


def make_engine(kind: str, **options: Any) -> Engine:
    """Build the engine of that kind ("embedded", "vllm" or "litellm") with its options.

    Options with a None value are left to the engine's defaults (config files spell "unset" as null).

    Raises:
        ConfigError: an unknown kind, or an option the engine does not take.
    """
    cls = _engine_class(kind)
    options = {k: v for k, v in options.items() if v is not None}
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"the {kind} engine has no option {', '.join(unknown)}; it takes {', '.join(sorted(accepted))}"
        )
    return cls(**options)
