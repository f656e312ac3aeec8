"""The whole client side of alight on loopback: store server, LLM proxy, runner pool.

The model behind the proxy is the scripted OpenAI-compatible server of tests.fixtures (reached
through the real LiteLLM engine), so agents get deterministic tool calls and answers; everything
between the agent and that server is alight's real code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alight.engines.litellm_engine import LiteLLMEngine
from alight.proxy.proxy import Proxy
from alight.proxy.server import ProxyServer
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.types import LLMResource
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.sample_agents import langgraph_script

SERVED_NAME = "policy"


@dataclass
class Loop:
    store_url: str
    proxy_url: str
    upstream: ScriptedOpenAIServer


@pytest.fixture
def loop_servers(tmp_path: Path) -> Iterator[Loop]:
    """Store (SQLite) + proxy (LiteLLM engine -> scripted upstream), the policy published as `llm`."""
    with (
        ScriptedOpenAIServer(langgraph_script) as upstream,
        StoreServer(SqliteStore(tmp_path / "store.db")) as store_server,
    ):
        engine = LiteLLMEngine(f"openai/{SERVED_NAME}", base_url=upstream.url, served_name=SERVED_NAME)
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            asyncio.run(_publish(store_server.url, proxy_server.url))
            yield Loop(store_server.url, proxy_server.url, upstream)
        finally:
            proxy_server.stop()


async def _publish(store_url: str, proxy_url: str) -> None:
    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model=SERVED_NAME)})
