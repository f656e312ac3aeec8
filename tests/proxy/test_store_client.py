"""The proxy writing to a store in another server (StoreServer + StoreClient): spans of calls still
in the writer's hands when the proxy stops are stored, refused spans are logged, calls never fail."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from tests.proxy.conftest import claim_at, spans_at


def test_spans_reach_a_store_server_and_survive_shutdown(tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from alight.engines.embedded import EmbeddedEngine

    with StoreServer(MemoryStore()) as store_server:
        rid, aid = asyncio.run(claim_at(store_server.url))
        engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=8, batch_wait_ms=1)
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            llm = openai.OpenAI(base_url=proxy_server.base_url(rid, aid), api_key="x", max_retries=0)
            for i in range(5):
                extra = {semconv.HEADER_SEQUENCE_ID: str(i + 1)}
                llm.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2, extra_headers=extra
                )  # type: ignore[arg-type]
            stray = openai.OpenAI(
                base_url=proxy_server.base_url("ro-unknown", "at-unknown"), api_key="x", max_retries=0
            )
            with caplog.at_level(logging.ERROR, logger="alight.proxy.recorder"):
                answer = stray.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )  # type: ignore[arg-type]
                assert answer.choices[0].message.content is not None
                proxy_server.flush()
            assert "could not store the LLM span of rollout ro-unknown" in caplog.text
        finally:
            proxy_server.stop()  # no flush before: stopping stores what is pending
        spans = asyncio.run(spans_at(store_server.url, rid))
        assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5]
        assert [s.attributes[semconv.LLM_REQUEST_MESSAGES][0]["content"] for s in spans] == [f"q{i}" for i in range(5)]
        assert all(s.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for s in spans)
