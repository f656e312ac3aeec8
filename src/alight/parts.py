"""The contract of a replaceable part: each kind of a part registered by name, in one place.

A part (engines, backends, stores, loops, runner pools, sandboxes, rewards, tracers) keeps one
`Registry` of its kinds: the config key that chooses one (`engine.kind`), and for each kind where
its class lives, as "module:Class" (imported only when the kind is chosen, so naming a kind costs
no heavy import). A kind's class states `check_config`, refusing the settings it cannot run with
(one-line ConfigError, before anything starts), and how it is built from its config; what the rest of
alight may ask about a kind (can its weights be updated? does it serve adapters?) is a class
attribute of that kind, never a comparison of its name. Adding a kind is a new file plus one
`register` call:

    ENGINES.register("my_engine", "my_package.engine:MyEngine")

and nothing else names it (the code-quality tests check that no module outside a part compares
the part's kind to a string).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from alight.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """The kinds of one part, by name, in the order registered (the first is the default).

    `key` is the config key that chooses a kind (for error messages). Each entry is a class or a
    "module:Class" string, imported on first use."""

    def __init__(self, key: str, entries: dict[str, str | type[T]] | None = None) -> None:
        self.key = key
        self._entries: dict[str, str | type[T]] = dict(entries or {})

    def register(self, kind: str, target: str | type[T]) -> None:
        """Make `kind` choosable: `target` is its class or "module:Class". Registering a name again
        replaces its class (a test's or a plugin's own kind)."""
        if not kind or not isinstance(kind, str):
            raise ValueError(f"{self.key}: a kind is a non-empty name, not {kind!r}")
        self._entries[kind] = target

    def unregister(self, kind: str) -> None:
        """Forget `kind` (a test's own kind, at its end)."""
        self._entries.pop(kind, None)

    def __contains__(self, kind: object) -> bool:
        return kind in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def check(self, kind: object) -> str:
        """`kind` itself when registered; else a one-line ConfigError naming the choices."""
        if not isinstance(kind, str) or kind not in self._entries:
            raise ConfigError(f"{self.key} must be one of {', '.join(self._entries)}, got {kind!r}")
        return kind

    def get(self, kind: object) -> type[T]:
        """The class of `kind` (imported now if named by a string); ConfigError for an unknown kind."""
        target = self._entries[self.check(kind)]
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module), attribute)
            assert isinstance(target, type), f"{self.key}={kind}: {module}:{attribute} is not a class"
            self._entries[str(kind)] = target
        return target
