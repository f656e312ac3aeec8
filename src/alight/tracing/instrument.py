"""`instrument_all`: hook every supported library that is installed, once per process.

A library already imported is hooked at once. One not imported yet is hooked right after its
first import (a post-import hook on `sys.meta_path`), so a runner process whose agent never uses
LangChain or the Agents SDK does not pay seconds importing them at start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_pending: dict[str, Callable[[], bool]] = {}  # module name -> its instrumentation, run after its import


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _instrument_openai() -> bool:
    from alight.tracing.openai_sdk import instrument_openai

    return instrument_openai()


def _instrument_anthropic() -> bool:
    from alight.tracing.anthropic_sdk import instrument_anthropic

    return instrument_anthropic()


def _instrument_langchain() -> bool:
    from alight.tracing.langchain import instrument_langchain

    return instrument_langchain()


def _instrument_agents() -> bool:
    try:
        from alight.tracing.openai_agents import instrument_openai_agents
    except ImportError as err:  # another package named `agents`
        logger.debug("not instrumenting the OpenAI Agents SDK: %s", err)
        return False
    return instrument_openai_agents()


def _instrument_autogen() -> bool:
    from alight.tracing.autogen import instrument_autogen

    return instrument_autogen()


def _instrument_crewai() -> bool:
    from alight.tracing.crewai import instrument_crewai

    return instrument_crewai()


def _instrument_http(library: str) -> Callable[[], bool]:
    def hook() -> bool:
        from alight.tracing import http_clients

        instrument: Callable[[], bool] = getattr(http_clients, f"instrument_{library}")
        return instrument()

    return hook


#: (module whose import triggers it, label, instrumentation)
_LIBRARIES: tuple[tuple[str, str, Callable[[], bool]], ...] = (
    ("openai", "openai", _instrument_openai),
    ("anthropic", "anthropic", _instrument_anthropic),
    ("langchain_core", "langchain", _instrument_langchain),
    ("agents", "openai-agents", _instrument_agents),
    # autogen_core, not AgentChat: its span helper must be wrapped before AgentChat imports it by name
    ("autogen_core", "autogen", _instrument_autogen),
    ("crewai", "crewai", _instrument_crewai),
    # Raw HTTP clients (proxy headers on requests to alight's proxy); openai and LiteLLM send through httpx.
    ("httpx", "httpx", _instrument_http("httpx")),
    ("requests", "requests", _instrument_http("requests")),
    ("aiohttp", "aiohttp", _instrument_http("aiohttp")),
    ("urllib.request", "urllib", _instrument_http("urllib")),
)


def _run(module: str, hook: Callable[[], bool]) -> bool:
    try:
        return hook()
    except Exception:  # instrumentation must never break the agent's own import
        logger.exception("alight could not instrument %s", module)
        return False


class _PostImportHooks(importlib.abc.MetaPathFinder):
    """Runs a library's instrumentation right after the library's first import."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_then_instrument(module: ModuleType) -> None:
            exec_module(module)
            hook = _pending.pop(fullname, None)
            if hook is not None and _run(fullname, hook):
                logger.debug("alight instrumented %s on import", fullname)

        loader.exec_module = exec_then_instrument  # type: ignore[method-assign]
        return spec


_hooks = _PostImportHooks()


def instrument_all() -> list[str]:
    """Instrument openai, anthropic, LangChain, the OpenAI Agents SDK, AutoGen, CrewAI and the HTTP
    clients (httpx, requests, aiohttp, urllib) where installed: at once when imported, else on their
    first import. Returns what was instrumented now or will be."""
    done: list[str] = []
    with _lock:
        for module, label, hook in _LIBRARIES:
            if module in sys.modules:
                if _run(module, hook):
                    done.append(label)
            elif module not in _pending and _installed(module):
                _pending[module] = hook
                done.append(f"{label} (on import)")
        if _pending and _hooks not in sys.meta_path:
            sys.meta_path.insert(0, _hooks)
    logger.debug("alight instrumented: %s", ", ".join(done) or "nothing")
    return done
