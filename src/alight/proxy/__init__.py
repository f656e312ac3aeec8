"""The LLM proxy: an OpenAI-compatible API in front of an engine that records every call as an LLM
span with token ids, per rollout attempt (`/rollout/{rollout_id}/attempt/{attempt_id}/v1/...`).

    proxy = Proxy(engine, store)
    with ProxyServer(proxy, port=8123) as server:   # server.url is the LLMResource endpoint
        ...
        await proxy.update_weights(state_dict, version=2)   # pause, drain, swap, resume
        await proxy.flush()                                  # spans of answered calls are stored

Spans are written in the background after each answer; `flush` (or stopping the server) makes
sure they are in the store. Sync callers use `server.update_weights(...)` / `server.flush()`.
"""

from __future__ import annotations

from alight.proxy.proxy import Proxy
from alight.proxy.routes import create_app
from alight.proxy.server import ProxyServer

__all__ = ["Proxy", "ProxyServer", "create_app"]
