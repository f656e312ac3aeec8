"""`instrument_all`: hook every supported library that is installed, once per process."""

from __future__ import annotations

import importlib.util
import logging
import threading

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def instrument_all() -> list[str]:
    """Instrument openai, LangChain and the OpenAI Agents SDK where installed; returns their names."""
    done: list[str] = []
    with _lock:
        if _installed("openai"):
            from alight.tracing.openai_sdk import instrument_openai

            if instrument_openai():
                done.append("openai")
        if _installed("langchain_core"):
            from alight.tracing.langchain import instrument_langchain

            if instrument_langchain():
                done.append("langchain")
        if _installed("agents") and _installed("openai"):
            try:
                from alight.tracing.openai_agents import instrument_openai_agents
            except ImportError as err:  # another package named `agents`
                logger.debug("not instrumenting the OpenAI Agents SDK: %s", err)
            else:
                if instrument_openai_agents():
                    done.append("openai-agents")
    logger.debug("alight instrumented: %s", ", ".join(done) or "nothing")
    return done
