"""The engine kinds by name (`ENGINES`, `engine.kind`) and how one is built from a config.

A new engine is a module whose `Engine` subclass states its capabilities and options (see
`alight.engines.base.Engine`), plus one line: `ENGINES.register("name", "module:Class")`. Heavy
imports stay lazy: a kind's module is imported when the kind is chosen.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from alight.engines.base import Engine
from alight.errors import ConfigError
from alight.parts import Registry

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig

#: The engine kinds (`engine.kind`), the default first.
ENGINES: Registry[Engine] = Registry(
    "engine.kind",
    {
        "embedded": "alight.engines.embedded:EmbeddedEngine",
        "vllm": "alight.engines.vllm_engine:VLLMEngine",
        "litellm": "alight.engines.litellm_engine:LiteLLMEngine",
    },
)


def engine_class(kind: str) -> type[Engine]:
    """The class of the engine kind `kind`; ConfigError naming the kinds for an unknown one."""
    return ENGINES.get(kind)


def engine_options(engine: EngineConfig, *, model: str | None = None) -> dict[str, Any]:
    """The keyword arguments that build the config's engine: its kind's options for the `engine`
    section, then `engine.options`; `model` (a directory the run resolved, or a checkpoint it
    serves) replaces `engine.model`."""
    cls = engine_class(engine.kind)
    return {**cls.options_from_config(engine, engine.model if model is None else model), **engine.options}


def construct(cls: type[Engine], options: dict[str, Any]) -> Engine:
    """`cls(**options)`, None values left to its defaults (config files spell "unset" as null);
    ConfigError naming an option the engine does not take."""
    options = {k: v for k, v in options.items() if v is not None}
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"the {cls.name} engine has no option {', '.join(unknown)}; it takes {', '.join(sorted(accepted))}"
        )
    return cls(**options)


def make_engine(kind: str, **options: Any) -> Engine:
    """Build the engine of that kind (a name in `ENGINES`) with its options.

    Raises:
        ConfigError: an unknown kind, or an option the engine does not take.
    """
    return construct(engine_class(kind), options)
