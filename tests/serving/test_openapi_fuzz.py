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
AUTH_EXAMPLES = 400
TOKEN = "tok-fuzz-0b8e"


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


def test_fuzzing_the_store_with_every_kind_of_credential_gets_no_5xx(tmp_path: Path) -> None:
    """The auth paths: the token, a runner credential, a live and an ended agent key, a forged
    one, an empty one, each on every route (the credential routes included)."""
    with StoreServer(
        SqliteStore(tmp_path / "auth.db"), watchdog_interval_s=None, max_wait_s=0.1, token=TOKEN
    ) as server:
        keys, ids = seeded_credentials(server.url)
        report = fuzz(server.url, ids, max_examples=AUTH_EXAMPLES, credentials=[TOKEN, *keys])
        print(f"store auth fuzz: {report.sent} requests, statuses {dict(sorted(report.statuses.items()))}")
        assert report.server_errors == 0, report.failures[:5]
        assert {200, 401, 403} <= set(report.statuses)
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


def seeded_credentials(url: str) -> tuple[list[str], list[str]]:
    """Credentials of every kind on a store with a token, and the ids they reach."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=admin) as http:
        runner = http.post("/store/runners", json={"name": "fuzz"}).json()["credential"]
        http.post("/store/enqueue", json={"rollouts": [{"task": {"input": i}} for i in range(3)]})
        as_runner = {"Authorization": f"Bearer {runner}"}
        live = http.post("/store/dequeue", json={}, headers=as_runner).json()
        ended = http.post("/store/dequeue", json={}, headers=as_runner).json()
        finish = {"status": "failed"}
        http.post(f"/store/attempts/{ended['attempt']['attempt_id']}/finish", json=finish, headers=as_runner)
    keys = [runner, live["agent_key"], ended["agent_key"], live["agent_key"][:-1] + "A", "alr.fuzz.forged", "-"]
    ids = [live["rollout"]["rollout_id"], live["attempt"]["attempt_id"], ended["attempt"]["attempt_id"], "1", "fuzz"]
    return keys, ids


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


def test_fuzzing_the_proxy_with_every_kind_of_credential_gets_no_5xx() -> None:
    """The proxy checks agent keys with the store (scripted engine: the auth paths are the point)."""
    from alight.store.client import StoreClient
    from tests.proxy.scripted import ScriptedEngine

    with StoreServer(MemoryStore(), watchdog_interval_s=None, token=TOKEN) as store:
        keys, ids = seeded_credentials(store.url)
        proxy_store = StoreClient(store.url, token=TOKEN)
        proxy = Proxy(ScriptedEngine(), proxy_store)
        with ProxyServer(proxy, token=TOKEN, admin=True, resolve=proxy_store.check_credential) as server:
            report = fuzz(server.url, [*ids, "scripted"], max_examples=AUTH_EXAMPLES, credentials=[TOKEN, *keys])
            print(f"proxy auth fuzz: {report.sent} requests, statuses {dict(sorted(report.statuses.items()))}")
            assert report.server_errors == 0, report.failures[:5]
            assert {200, 401, 403} <= set(report.statuses)
            assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
