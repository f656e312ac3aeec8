"""`Tracer.instrument()` imports no agent library itself; each is hooked on its first import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHECK = textwrap.dedent(
    """
    import sys
    from alight.tracing import make_tracer

    make_tracer("light").instrument()
    libraries = ("openai", "anthropic", "langchain_core", "agents", "autogen_core", "httpx", "requests", "aiohttp")
    print(sorted(m for m in libraries if m in sys.modules))
    import openai._base_client as base
    import httpx
    print(hasattr(base.SyncAPIClient.request, "__wrapped__") and hasattr(httpx.Client.send, "__wrapped__"))
    import agents
    from alight.tracing import instrument
    print(sorted(instrument._pending))
    import anthropic._base_client as anthropic_base
    print(hasattr(anthropic_base.AsyncAPIClient.request, "__wrapped__"))
    """
)


def test_libraries_are_hooked_on_their_first_import_not_before() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported_at_instrument, openai_hooked, still_pending, anthropic_hooked = done.stdout.split("\n")[:4]
    assert imported_at_instrument == "[]"
    assert openai_hooked == "True"
    # The Agents SDK imports neither anthropic, LangChain nor AutoGen, nor requests or aiohttp (openai brings httpx).
    assert still_pending == "['aiohttp', 'anthropic', 'autogen_core', 'langchain_core', 'requests']"
    assert anthropic_hooked == "True"
