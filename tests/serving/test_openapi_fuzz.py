"""The store's and the proxy's OpenAPI documents, and a property-based fuzz run against each real
server (`schema_fuzz`): no answer is a 5xx, and the server still answers its health check after.

Bounded: a fixed number of derandomized examples per server (the same requests every run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from tests.serving.schema_fuzz import fuzz

STORE_EXAMPLES = 1000
PROXY_EXAMPLES = 600


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[StoreServer]:
    with StoreServer(SqliteStore(tmp_path / "store.db"), watchdog_interval_s=None, max_wait_s=0.1) as server:
        yield server


def seeded_ids(url: str) -> list[str]:
    """A claimed rollout and a published resource set, so fuzzed paths also reach real objects."""
    with httpx.Client(base_url=url) as http:
        http.post("/store/enqueue", json={"rollouts": [{"task": {"input": "q"}}, {"task": {"input": "r"}}]})
        claim = http.post("/store/dequeue", json={}).json()
        http.post("/store/resources", json={"resources": {"t": {"type": "prompt_template", "template": "x"}}})
    return [claim["rollout"]["rollout_id"], claim["attempt"]["attempt_id"], "1", "latest", "all"]


def test_the_store_serves_its_openapi_document(store_server: StoreServer) -> None:
    document = httpx.get(f"{store_server.url}/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {"/store/spans", "/store/wait", "/v1/traces", "/store/resources/{version}"} <= set(document["paths"])
    spans = document["paths"]["/store/spans"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert spans == {"$ref": "#/components/schemas/SpansBody"}
    assert "Span" in document["components"]["schemas"]


def test_fuzzing_the_store_gets_no_5xx(store_server: StoreServer) -> None:
    report = fuzz(store_server.url, seeded_ids(store_server.url), max_examples=STORE_EXAMPLES)
    print(f"store fuzz: {report.sent} requests, statuses {dict(sorted(report.statuses.items()))}")
    assert report.server_errors == 0, report.failures[:5]
    assert report.sent >= STORE_EXAMPLES // 2
    assert httpx.get(f"{store_server.url}/health").json() == {"status": "ok"}


@pytest.fixture(scope="module")
def proxy_server(tiny_dir: Path) -> Iterator[ProxyServer]:
    from alight.engines.embedded import EmbeddedEngine

    # A 64-token context keeps every fuzzed generation short.
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=4, max_context=64, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore()), admin=True) as server:
        yield server


def test_the_proxy_serves_its_openapi_document(proxy_server: ProxyServer) -> None:
    document = httpx.get(f"{proxy_server.url}/openapi.json").json()
    paths = set(document["paths"])
    assert {"/v1/chat/completions", "/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"} <= paths
    assert "/v1/models/{model}" in paths and "/admin/weights" in paths
    assert "ChatBody" in document["components"]["schemas"]


def test_fuzzing_the_proxy_gets_no_5xx(proxy_server: ProxyServer) -> None:
    report = fuzz(proxy_server.url, ["ro-1", "at-1", *proxy_server.proxy.model_names], max_examples=PROXY_EXAMPLES)
    print(f"proxy fuzz: {report.sent} requests, statuses {dict(sorted(report.statuses.items()))}")
    assert report.server_errors == 0, report.failures[:5]
    assert report.sent >= PROXY_EXAMPLES // 2
    assert httpx.get(f"{proxy_server.url}/health").json()["status"] == "ok"
