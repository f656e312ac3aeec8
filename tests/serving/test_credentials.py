"""The three kinds of credential on real servers: the admin token, runner credentials minted by the
store server, and per-attempt agent keys (minted at claim, checked by the store and by the proxy).
Real store server, real proxy (its engine scripted: no model runs here), real clients."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from alight.errors import ForbiddenError, InvalidRequestError, UnauthorizedError
from alight.proxy import Proxy, ProxyServer
from alight.serving.credentials import AGENT_PREFIX, Credentials, digest, runner_name_of
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.types import AttemptStatus, Rollout, RolloutStatus, Span, Task
from tests.proxy.scripted import ScriptedEngine

TOKEN = "tok-admin-5d1e0c2b9a"


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture
def server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), token=TOKEN, watchdog_interval_s=None) as running:
        yield running


# -- the registry -------------------------------------------------------------------------------


def test_credentials_are_random_kept_as_hashes_and_found_only_whole() -> None:
    credentials = Credentials(TOKEN)
    alice = credentials.mint_runner("alice")
    again = credentials.mint_runner("alice")
    key = credentials.mint_agent("ro-1", "at-1", spans=True)
    assert alice != again and runner_name_of(alice) == "alice" and key.startswith(AGENT_PREFIX)
    assert len(key) > 40
    assert credentials.lookup(TOKEN) is not None and credentials.lookup(TOKEN).kind == "admin"  # type: ignore[union-attr]
    runner = credentials.lookup(alice)
    assert runner is not None and runner.kind == "runner" and runner.name == "alice"
    agent = credentials.lookup(key)
    assert agent is not None and (agent.kind, agent.attempt_id, agent.rollout_id, agent.spans) == (
        "agent", "at-1", "ro-1", True
    )  # fmt: skip
    for wrong in (key[:-1], key + "x", alice[:-1], TOKEN + " ", "", "alr.alice.", AGENT_PREFIX):
        assert credentials.lookup(wrong) is None, wrong
    kept = repr(vars(credentials))
    assert alice not in kept and key not in kept and digest(key) in kept  # only hashes are kept
    # A new key replaces the attempt's old one; revoking ends it.
    newer = credentials.mint_agent("ro-1", "at-1")
    assert credentials.lookup(key) is None and credentials.lookup(newer) is not None
    credentials.revoke("at-1")
    assert credentials.lookup(newer) is None and credentials.agent_keys == 0


def test_runner_names_and_the_holds_rule() -> None:
    credentials = Credentials(TOKEN)
    for bad in ("", "a/b", "tab\there", "x" * 201):
        with pytest.raises(InvalidRequestError):
            credentials.mint_runner(bad)
    grant = credentials.lookup(credentials.mint_runner("pool-1"))
    assert grant is not None
    assert grant.holds("pool-1") and grant.holds("pool-1/w0.1")
    assert not grant.holds("pool-10") and not grant.holds("pool-1x/w") and not grant.holds(None)


# -- runner credentials on the store server -------------------------------------------------------


@pytest.mark.anyio
async def test_a_runner_credential_acts_only_on_its_own_attempts_whatever_header_it_sends(
    server: StoreServer,
) -> None:
    async with StoreClient(server.url, token=TOKEN) as admin:
        alice_key = await admin.register_runner("alice")
        mallory_key = await admin.register_runner("mallory")
        [victim, other] = await admin.enqueue([Rollout(task=Task(input="v")), Rollout(task=Task(input="o"))])
        async with (
            StoreClient(server.url, token=alice_key) as alice,
            StoreClient(server.url, token=mallory_key, runner_id="alice") as mallory,  # sends X-Alight-Runner: alice
        ):
            claim = await alice.dequeue()
            assert claim is not None and claim.attempt.worker_id == "alice" and claim.agent_key
            attempt_id = claim.attempt.attempt_id
            await alice.start_attempt(attempt_id)
            await alice.add_spans([Span(rollout_id=victim.rollout_id, attempt_id=attempt_id, name="own")])
            before = await _dump(admin, victim.rollout_id)

            forged = Span(rollout_id=victim.rollout_id, attempt_id=attempt_id, name="forged")
            for write in (
                mallory.add_spans([forged]),
                mallory.start_attempt(attempt_id),
                mallory.heartbeat(attempt_id),
                mallory.get_attempt(attempt_id),
                mallory.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=1.0),
                mallory.query_spans(victim.rollout_id, attempt_id),
                mallory.dequeue("alice"),  # cannot claim in another runner's name
                mallory.dequeue("alice/w1"),
            ):
                with pytest.raises(ForbiddenError):
                    await write
            for headers in ({"X-Alight-Runner": "alice"}, {"X-Alight-Runner": "alice", "X-Alight-Worker": "alice"}):
                answer = httpx.post(
                    f"{server.url}/store/spans",
                    json={"spans": [forged.model_dump(mode="json")]},
                    headers=bearer(mallory_key, **headers),
                )
                assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
            otlp = _otlp_json(victim.rollout_id, attempt_id)
            assert httpx.post(f"{server.url}/v1/traces", json=otlp, headers=bearer(mallory_key)).status_code == 403
            assert await _dump(admin, victim.rollout_id) == before  # nothing changed

            # What only the admin token may do.
            for method, path, body in _ADMIN_ONLY:
                answer = httpx.request(method, f"{server.url}{path}", json=body, headers=bearer(alice_key))
                assert answer.status_code == 403, (path, answer.text)
            # A worker under alice's name claims for alice; its attempts are alice's.
            worker_claim = await alice.dequeue("alice/w1")
            assert worker_claim is not None and worker_claim.rollout.rollout_id == other.rollout_id
            await alice.start_attempt(worker_claim.attempt.attempt_id)
            done = await alice.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=0.5)
            assert done.status == RolloutStatus.SUCCEEDED and done.reward == 0.5


_ADMIN_ONLY: list[tuple[str, str, Any]] = [
    ("POST", "/store/enqueue", {"rollouts": []}),
    ("POST", "/store/rollouts/query", {}),
    ("GET", "/store/rollouts", None),
    ("POST", "/store/bulk/spans", {"rollout_ids": []}),
    ("POST", "/store/bulk/rollouts", {"rollout_ids": []}),
    ("POST", "/store/bulk/columns", {"rollout_ids": []}),
    ("POST", "/store/resources", {"resources": {}}),
    ("POST", "/store/reap", {"at": 1e12}),
    ("POST", "/store/wait", {"rollout_ids": [], "timeout": 0}),
    ("POST", "/store/runners", {"name": "another"}),
    ("POST", "/store/credentials/check", {"credential": TOKEN}),
]


async def _dump(store: StoreClient, *rollout_ids: str) -> list[Any]:
    """Everything the store holds about `rollout_ids`, plus the resources and the counts."""
    dump: list[Any] = [await store.count_by_status(), await store.get_latest_resources()]
    for rollout_id in rollout_ids:
        dump.append(await store.get_rollout(rollout_id))
        dump.append(await store.list_attempts(rollout_id))
        dump.append(await store.span_dicts([rollout_id], all_attempts=True))
    return dump


def _otlp_json(rollout_id: str, attempt_id: str, reward: float = 99.0) -> dict[str, Any]:
    attributes = [
        {"key": "alight.rollout_id", "value": {"stringValue": rollout_id}},
        {"key": "alight.attempt_id", "value": {"stringValue": attempt_id}},
        {"key": "alight.reward.value", "value": {"doubleValue": reward}},
    ]
    span = {
        "traceId": "0" * 31 + "1",
        "spanId": "0" * 15 + "1",
        "name": "reward",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": attributes,
    }
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}


# -- agent keys on the store server and the proxy ------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("agent_spans", [False, True])
async def test_an_agent_key_writes_only_its_own_spans_where_allowed_and_ends_with_its_attempt(
    agent_spans: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with StoreServer(MemoryStore(), token=TOKEN, watchdog_interval_s=None, agent_spans=agent_spans) as server:
        async with StoreClient(server.url, token=TOKEN) as admin:
            runner_key = await admin.register_runner("r")
            [mine, theirs] = await admin.enqueue([Rollout(task=Task(input=1)), Rollout(task=Task(input=2))])
            async with StoreClient(server.url, token=runner_key) as runner:
                claim = await runner.dequeue()
                other = await runner.dequeue()
                assert claim is not None and other is not None and claim.agent_key and other.agent_key
                key, attempt_id = claim.agent_key, claim.attempt.attempt_id
                assert (await admin.check_credential(key)).attempt_id == attempt_id  # type: ignore[union-attr]
                own = Span(rollout_id=claim.rollout.rollout_id, attempt_id=attempt_id, name="reward")
                foreign = Span(rollout_id=other.rollout.rollout_id, attempt_id=other.attempt.attempt_id, name="x")
                mixed = Span(rollout_id=other.rollout.rollout_id, attempt_id=attempt_id, name="x")
                async with StoreClient(server.url, token=key) as agent:
                    if agent_spans:
                        assert await agent.add_spans([own]) == 1
                    else:
                        with pytest.raises(ForbiddenError, match="agent_spans"):
                            await agent.add_spans([own])
                    for span in (foreign, mixed):
                        with pytest.raises(ForbiddenError):
                            await agent.add_spans([span])
                    own_otlp = _otlp_json(claim.rollout.rollout_id, attempt_id)
                    answer = httpx.post(f"{server.url}/v1/traces", json=own_otlp, headers=bearer(key))
                    assert answer.status_code == (200 if agent_spans else 403)
                    foreign_otlp = _otlp_json(other.rollout.rollout_id, other.attempt.attempt_id)
                    assert (
                        httpx.post(f"{server.url}/v1/traces", json=foreign_otlp, headers=bearer(key)).status_code == 403
                    )
                    for call in (
                        agent.heartbeat(attempt_id),
                        agent.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=9.0),
                        agent.get_latest_resources(),
                        agent.query_spans(claim.rollout.rollout_id, attempt_id),
                        agent.count_by_status(),
                        agent.dequeue(),
                    ):
                        with pytest.raises(ForbiddenError):
                            await call
                    await runner.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=0.25)
                    with pytest.raises(UnauthorizedError):
                        await agent.add_spans([own])  # its attempt has ended: the key is refused
                    assert await admin.check_credential(key) is None
                # An attempt the store ends itself (a cancelled rollout) ends its key too.
                assert await admin.check_credential(other.agent_key) is not None
                await admin.finish_rollout(theirs.rollout_id, RolloutStatus.CANCELLED)
                assert await admin.check_credential(other.agent_key) is None
            spans = await admin.query_spans(mine.rollout_id, attempt_id)
            assert [s.name for s in spans] == (["reward", "reward"] if agent_spans else [])
            # Never returned by a read, never logged.
            reads = [await admin.get_rollout(mine.rollout_id), await admin.list_attempts(mine.rollout_id)]
            for secret in (key, other.agent_key, runner_key):
                assert secret not in repr(reads) and secret not in caplog.text and secret not in repr(claim)


@pytest.mark.anyio
async def test_the_proxy_opens_an_attempts_routes_to_its_key_only(server: StoreServer) -> None:
    async with StoreClient(server.url, token=TOKEN) as admin:
        runner_key = await admin.register_runner("r")
        await admin.enqueue([Rollout(task=Task(input=1)), Rollout(task=Task(input=2))])
        async with StoreClient(server.url, token=runner_key) as runner:
            mine, theirs = await runner.dequeue(), await runner.dequeue()
            assert mine is not None and theirs is not None and mine.agent_key
            for claim in (mine, theirs):
                await runner.start_attempt(claim.attempt.attempt_id)
            proxy_store = StoreClient(server.url, token=TOKEN)
            proxy = Proxy(ScriptedEngine(), proxy_store)
            with ProxyServer(proxy, token=TOKEN, admin=True, resolve=proxy_store.check_credential) as served:

                def route(claim: Any) -> str:
                    return f"{served.url}/rollout/{claim.rollout.rollout_id}/attempt/{claim.attempt.attempt_id}"

                client = openai.OpenAI(base_url=route(mine) + "/v1", api_key=mine.agent_key, max_retries=0)
                answer = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
                assert answer.choices[0].message.content
                assert client.models.list().data
                body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
                for url in (
                    route(theirs) + "/v1/chat/completions",  # another attempt's route
                    f"{served.url}/rollout/{mine.rollout.rollout_id}/attempt/{theirs.attempt.attempt_id}/v1/chat/completions",
                    f"{served.url}/v1/chat/completions",  # the plain route (not recorded to any attempt)
                    route(theirs) + "/v1/responses",
                    route(theirs) + "/v1/completions",
                    f"{served.url}/admin/weights",
                ):
                    assert httpx.post(url, json=body, headers=bearer(mine.agent_key)).status_code == 403, url
                messages = httpx.post(
                    route(theirs) + "/v1/messages",
                    json={**body, "max_tokens": 8},
                    headers={"x-api-key": mine.agent_key},
                )
                assert messages.status_code == 403 and messages.json()["type"] == "error"  # Anthropic's shape
                # The runner's own credential opens no proxy route: the agent's key does.
                assert (
                    httpx.post(route(mine) + "/v1/chat/completions", json=body, headers=bearer(runner_key)).status_code
                    == 403
                )
                served.flush()
                await runner.finish_attempt(mine.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
                with pytest.raises(openai.AuthenticationError):
                    client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "again"}])
            recorded = await admin.query_spans(mine.rollout.rollout_id, mine.attempt.attempt_id)
            assert [span.kind.value for span in recorded] == ["llm"]  # its own call, recorded once
            assert await admin.query_spans(theirs.rollout.rollout_id, theirs.attempt.attempt_id) == []


def test_without_a_token_runners_need_no_credential_and_claims_carry_no_key() -> None:
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        answer = httpx.post(f"{server.url}/store/runners", json={"name": "r"})
        assert answer.status_code == 403 and "no token" in answer.json()["error"]["message"]
        httpx.post(
            f"{server.url}/store/enqueue", json={"rollouts": [Rollout(task=Task(input=1)).model_dump(mode="json")]}
        )
        claim = httpx.post(f"{server.url}/store/dequeue", json={}, headers={"X-Alight-Runner": "r"}).json()
        assert claim["attempt"]["worker_id"] == "r" and claim["agent_key"] is None


@pytest.mark.anyio
async def test_an_agent_key_ends_with_a_reaped_attempt_at_once_and_with_one_ended_elsewhere_soon(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.store import scopes

    monkeypatch.setattr(scopes, "AGENT_RECHECK_S", 0.3)
    async with StoreClient(server.url, token=TOKEN) as admin:
        runner_key = await admin.register_runner("r")
        async with StoreClient(server.url, token=runner_key) as runner:
            # Timed out by a reap the server runs: refused at once.
            await admin.enqueue([Rollout(task=Task(input=1))])
            reaped = await runner.dequeue()
            assert reaped is not None and reaped.agent_key
            await runner.start_attempt(reaped.attempt.attempt_id)
            assert await admin.check_credential(reaped.agent_key) is not None
            done = await admin.reap_timed_out(time.time() + 3600)
            assert [a.attempt_id for a in done] == [reaped.attempt.attempt_id]
            assert await admin.check_credential(reaped.agent_key) is None
            # Ended behind the server's back (on its store directly): refused once the last check is old.
            await admin.enqueue([Rollout(task=Task(input=2))])
            elsewhere = await runner.dequeue()
            assert elsewhere is not None and elsewhere.agent_key
            await runner.start_attempt(elsewhere.attempt.attempt_id)
            assert await admin.check_credential(elsewhere.agent_key) is not None
            other = elsewhere.attempt.attempt_id
            server.run(server.store.finish_attempt(other, AttemptStatus.FAILED, error="ended elsewhere"), 10)
            await asyncio.sleep(0.4)
            assert await admin.check_credential(elsewhere.agent_key) is None


def test_a_pool_started_with_a_runner_credential_claims_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """`alight runner` on another machine holds a runner credential only (ALIGHT_RUNNER_CREDENTIAL):
    its workers claim as `<name>/<worker>` and their agents get their attempts' keys."""
    from alight.runner.pool import RunnerPool
    from alight.types import LLMResource

    monkeypatch.delenv("ALIGHT_TOKEN", raising=False)
    with StoreServer(MemoryStore(), token=TOKEN, watchdog_interval_s=0.5) as server:

        async def register_and_enqueue() -> tuple[str, list[str]]:
            async with StoreClient(server.url, token=TOKEN) as admin:
                await admin.add_resources({"llm": LLMResource(endpoint="http://127.0.0.1:1", model="m")})
                rollouts = [Rollout(task=Task(input={"api_key": TOKEN})) for _ in range(2)]
                ids = [r.rollout_id for r in await admin.enqueue(rollouts)]
                return await admin.register_runner("host-b"), ids

        credential, ids = asyncio.run(register_and_enqueue())
        monkeypatch.setenv("ALIGHT_RUNNER_CREDENTIAL", credential)
        agent = "tests/runner/agents.py:agent_key_check"
        with RunnerPool(agent, server.url, n_runners=1, instrument=False) as pool:
            assert pool.wait_for_idle(timeout_s=60)

        async def ended() -> list[tuple[float | None, str | None]]:
            async with StoreClient(server.url, token=TOKEN) as admin:
                rollouts = [await admin.get_rollout(rollout_id) for rollout_id in ids]
                return [(r.reward, (await admin.list_attempts(r.rollout_id))[0].worker_id) for r in rollouts]

        results = asyncio.run(ended())
        assert [reward for reward, _ in results] == [1.0, 1.0]
        assert all(str(worker).startswith("host-b/") for _, worker in results), results


@pytest.mark.anyio
async def test_a_runner_credential_outlives_a_store_restart_with_the_same_token_only(tmp_path: Any) -> None:
    from alight.store.sqlite import SqliteStore

    with StoreServer(SqliteStore(tmp_path / "s.db"), token=TOKEN, watchdog_interval_s=None) as first:
        async with StoreClient(first.url, token=TOKEN) as admin:
            credential = await admin.register_runner("host.b")  # a name with a dot
            await admin.enqueue([Rollout(task=Task(input=1))])
    assert runner_name_of(credential) == "host.b"
    with StoreServer(SqliteStore(tmp_path / "s.db"), token=TOKEN, watchdog_interval_s=None) as again:
        async with StoreClient(again.url, token=credential) as runner:
            claim = await runner.dequeue()
            assert claim is not None and claim.attempt.worker_id == "host.b"
        name, nonce, mac = credential.rsplit(".", 2)
        for forged in (f"{name[:-1]}c.{nonce}.{mac}", f"{name}.{nonce}x.{mac}", f"alr.other.{nonce}.{mac}"):
            assert httpx.get(f"{again.url}/store/counts", headers=bearer(forged)).status_code == 401
    with StoreServer(SqliteStore(tmp_path / "s.db"), token=TOKEN + "-rotated", watchdog_interval_s=None) as rotated:
        assert httpx.get(f"{rotated.url}/store/counts", headers=bearer(credential)).status_code == 401
