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
    print(sorted(m for m in ("openai", "anthropic", "langchain_core", "agents", "autogen_core") if m in sys.modules))
    import openai._base_client as base
    print(hasattr(base.SyncAPIClient.request, "__wrapped__"))
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
    assert still_pending == "['anthropic', 'autogen_core', 'langchain_core']"  # the Agents SDK imports none
    assert anthropic_hooked == "True"
