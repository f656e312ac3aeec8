"""Authentication and runner scopes on real servers: the store server, the proxy, `alight store`,
`alight serve` and a runner pool, with real clients (httpx, StoreClient, the openai SDK)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from alight.agent import bind_resources
from alight.errors import ConfigError, ForbiddenError, UnauthorizedError
from alight.proxy import Proxy, ProxyServer
from alight.serving.auth import bearer_matches, check_bind, is_loopback
from alight.store import MemoryStore
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.types import AttemptStatus, LLMResource, Rollout, RolloutStatus, Span, Task
from tests.proxy.scripted import ScriptedEngine
from tests.test_cli import ALIGHT, free_port

TOKEN = "tok-3f9a1c7e5b2d"
# Beyond loopback, where the sandbox allows it; the token check is the same on any address.
ANY = "0.0.0.0"


def local(url: str) -> str:
    return url.replace("0.0.0.0", "127.0.0.1")


@pytest.fixture
def store_server() -> Iterator[StoreServer]:
    with StoreServer(MemoryStore(), host=ANY, token=TOKEN, watchdog_interval_s=None) as server:
        yield server


# -- the pieces ---------------------------------------------------------------------------------


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.5.0.1", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.3", "example.org"]))


def test_bearer_matches_only_the_exact_token() -> None:
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN) and bearer_matches(f"bearer {TOKEN}", TOKEN)
    for header in (None, "", TOKEN, f"Bearer {TOKEN}x", f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN[:-1]}"):
        assert not bearer_matches(header, TOKEN), header


def test_bind_beyond_loopback_needs_a_token_or_insecure(caplog: pytest.LogCaptureFixture) -> None:
    check_bind("127.0.0.1", None)
    check_bind(ANY, TOKEN)
    with pytest.raises(ConfigError, match="without a token: set --token or ALIGHT_TOKEN"):
        check_bind(ANY, None, what="store server")
    with pytest.raises(ConfigError):
        StoreServer(MemoryStore(), host=ANY)
    with pytest.raises(ConfigError):
        ProxyServer(Proxy(ScriptedEngine(), None), host="10.1.2.3")
    with caplog.at_level(logging.WARNING):
        check_bind(ANY, None, insecure=True, what="store server")
    assert "with no token (--insecure)" in caplog.text


# -- the store server ---------------------------------------------------------------------------


def test_store_answers_401_without_or_with_a_wrong_token_and_touches_nothing(store_server: StoreServer) -> None:
    url = local(store_server.url)
    body = {"rollouts": [Rollout(task=Task(input=1)).model_dump(mode="json")]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        answer = httpx.post(f"{url}/store/enqueue", json=body, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["code"] == "unauthorized" and "\n" not in error["message"]
        assert TOKEN not in answer.text
        assert httpx.post(f"{url}/store/reap", json={"at": 1e12}, headers=headers).status_code == 401
        assert httpx.get(f"{url}/store/resources/latest", headers=headers).status_code == 401
        assert httpx.get(f"{url}/no/such/route", headers=headers).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200  # liveness stays open, reads nothing
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{url}/store/counts", headers=authorized).json()["queuing"] == 0  # nothing was enqueued
    assert httpx.post(f"{url}/store/enqueue", json=body, headers=authorized).status_code == 200


@pytest.mark.anyio
async def test_store_client_with_the_token_runs_a_whole_attempt(store_server: StoreServer) -> None:
    url = local(store_server.url)
    async with StoreClient(url, token=TOKEN) as trainer, StoreClient(url, token=TOKEN, runner_id="r1") as runner:
        [rollout] = await trainer.enqueue([Rollout(task=Task(input="q"))])
        claim = await runner.dequeue("r1")
        assert claim is not None and claim.attempt.worker_id == "r1"
        attempt_id = claim.attempt.attempt_id
        await runner.start_attempt(attempt_id)
        await runner.heartbeat(attempt_id)
        assert await runner.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt_id, name="step")]) == 1
        runner.add_spans_nowait([Span(rollout_id=rollout.rollout_id, attempt_id=attempt_id, name="more")])
        await runner.flush()
        done = await runner.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        assert done.status == RolloutStatus.SUCCEEDED and done.reward == 1.0
        assert [span.name for span in await trainer.query_spans(rollout.rollout_id)] == ["step", "more"]
        assert (await trainer.get_attempt(attempt_id)).worker_id == "r1"


@pytest.mark.anyio
async def test_store_client_with_a_wrong_token_fails_at_once(store_server: StoreServer) -> None:
    for token in ("wrong", ""):  # "": no token at all (not even ALIGHT_TOKEN's)
        async with StoreClient(local(store_server.url), token=token, max_retries=3) as client:
            started = time.monotonic()
            with pytest.raises(UnauthorizedError, match="token"):
                await client.enqueue([Rollout(task=Task(input=1))])
            assert time.monotonic() - started < 2.0  # a 401 is not retried


@pytest.mark.anyio
async def test_store_client_reads_the_token_from_alight_token(
    store_server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)
    async with StoreClient(local(store_server.url)) as client:
        assert await client.enqueue([Rollout(task=Task(input=1))])


# -- runner scopes ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_without_a_token_a_runner_named_in_its_header_cannot_write_into_another_runners_attempt() -> None:
    """On loopback without a token, as before credentials: X-Alight-Runner scopes a runner's writes
    (with a token the name comes from the runner's credential: tests/serving/test_credentials.py)."""
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
        await _header_scopes(server.url)


async def _header_scopes(url: str) -> None:
    async with (
        StoreClient(url, token="") as trainer,
        StoreClient(url, token="", runner_id="alice") as alice,
        StoreClient(url, token="", runner_id="mallory") as mallory,
    ):
        [rollout] = await trainer.enqueue([Rollout(task=Task(input="q"))])
        claim = await alice.dequeue("alice")
        assert claim is not None
        attempt_id = claim.attempt.attempt_id
        forged = Span(rollout_id=rollout.rollout_id, attempt_id=attempt_id, name="reward")
        with pytest.raises(ForbiddenError, match="claimed by another runner"):
            await mallory.add_spans([forged])  # through the span batcher's grouped request
        with pytest.raises(ForbiddenError):
            await mallory.start_attempt(attempt_id)
        with pytest.raises(ForbiddenError):
            await mallory.heartbeat(attempt_id)
        with pytest.raises(ForbiddenError):
            await mallory.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(ForbiddenError):
            await mallory.dequeue("alice")  # cannot claim in another runner's name
        answer = httpx.post(
            f"{url}/store/spans",
            json={"spans": [forged.model_dump(mode="json")]},
            headers={"X-Alight-Runner": "mallory"},
        )
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
        assert await trainer.query_spans(rollout.rollout_id) == []  # nothing was written
        assert (await trainer.get_rollout(rollout.rollout_id)).status == RolloutStatus.RUNNING

        await alice.start_attempt(attempt_id)
        assert await alice.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt_id, name="own")]) == 1
        done = await alice.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=0.5)
        assert done.reward == 0.5
        # Writes that are not runner-scoped (the trainer, the proxy's LLM spans) still go through.
        assert await trainer.add_spans([Span(rollout_id=rollout.rollout_id, attempt_id=attempt_id, name="llm")]) == 1


# -- secrets ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_api_keys_are_returned_to_authenticated_readers_only() -> None:
    secret = LLMResource(endpoint="http://upstream/v1", model="m", api_key="sk-upstream")
    with StoreServer(MemoryStore(), token=TOKEN, watchdog_interval_s=None) as server:
        async with StoreClient(server.url, token=TOKEN) as client:
            published = await client.add_resources({"llm": secret})
            latest = await client.get_latest_resources()
            assert latest is not None and latest.resources["llm"].api_key == "sk-upstream"  # type: ignore[union-attr]
            assert (await client.get_resources(published.version)).resources["llm"] == secret
    with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:  # no token: nobody is authenticated
        async with StoreClient(server.url) as client:
            published = await client.add_resources({"llm": secret})
            for read in (await client.get_latest_resources(), await client.get_resources(published.version)):
                assert read is not None
                assert read.resources["llm"] == secret.model_copy(update={"api_key": None})
            assert "sk-upstream" not in httpx.get(f"{server.url}/store/resources/latest").text


def test_runners_hand_agents_their_attempts_key_as_the_llm_api_key() -> None:
    from alight.types import ResourceSet

    resources = ResourceSet(
        version=1, resources={"llm": LLMResource(endpoint="http://proxy", model="m", api_key="sk-x")}, created_at=0.0
    )
    assert bind_resources(resources, "ro", "at", agent_key="ala.k")["llm"].api_key == "ala.k"
    assert bind_resources(resources, "ro", "at", api_key="other")["llm"].api_key == "sk-x"
    plain = ResourceSet(version=1, resources={"llm": LLMResource(endpoint="http://proxy", model="m")}, created_at=0.0)
    assert bind_resources(plain, "ro", "at")["llm"].api_key == "alight"


def test_a_runner_pool_with_the_token_works_and_never_logs_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool registers with the token; its workers drop it and their agents get their attempt's key."""
    from alight.runner.pool import RunnerPool

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)  # the pool reads it; its workers must not keep it
    agent = "tests/runner/agents.py:agent_key_check"
    with StoreServer(MemoryStore(), host=ANY, token=TOKEN, watchdog_interval_s=0.5) as server:
        url = local(server.url)

        async def publish_and_enqueue() -> list[str]:
            async with StoreClient(url, token=TOKEN) as store:
                await store.add_resources({"llm": LLMResource(endpoint="http://127.0.0.1:1", model="m")})
                rollouts = [Rollout(task=Task(input={"api_key": TOKEN})) for _ in range(2)]
                return [r.rollout_id for r in await store.enqueue(rollouts)]

        ids = asyncio.run(publish_and_enqueue())
        with RunnerPool(agent, url, n_runners=1, instrument=False) as pool:
            assert pool.wait_for_idle(timeout_s=60)

        async def rewards() -> list[float | None]:
            async with StoreClient(url, token=TOKEN) as store:
                return [(await store.get_rollout(rollout_id)).reward for rollout_id in ids]

        assert asyncio.run(rewards()) == [1.0, 1.0]
    assert TOKEN not in caplog.text


# -- the proxy ----------------------------------------------------------------------------------


def test_proxy_takes_the_token_as_the_openai_api_key() -> None:
    with ProxyServer(Proxy(ScriptedEngine(), MemoryStore()), host=ANY, token=TOKEN) as server:
        base = local(server.url) + "/v1"
        answer = openai.OpenAI(base_url=base, api_key=TOKEN).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content
        for key in ("wrong", "alight"):
            with pytest.raises(openai.AuthenticationError) as raised:
                openai.OpenAI(base_url=base, api_key=key, max_retries=0).models.list()
            assert raised.value.status_code == 401
        plain = httpx.post(f"{base}/chat/completions", json={"model": "scripted", "messages": []})
        assert plain.status_code == 401
        error = plain.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "unauthorized"
        assert httpx.get(f"{local(server.url)}/health").status_code == 200


# -- the commands -------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "ALIGHT_TOKEN"}
    return {**env, **extra}


@pytest.mark.parametrize("command", [["store"], ["serve", "--engine", "litellm", "--model", "openai/m"]])
def test_commands_refuse_to_bind_beyond_loopback_without_a_token(command: list[str]) -> None:
    result = subprocess.run(
        [*ALIGHT, *command, "--host", ANY, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--insecure" in lines[0], result.stderr


@contextmanager
def serving(command: list[str], env: dict[str, str]) -> Iterator[tuple[str, list[str]]]:
    """Run `alight COMMAND --host 0.0.0.0` until /health answers and its first stderr line (the
    banner) is out; after the block, the list holds its stderr."""
    port = free_port()
    proc = subprocess.Popen(
        [*ALIGHT, *command, "--host", ANY, "--port", str(port)], stderr=subprocess.PIPE, text=True, env=env
    )
    url, stderr, lines = f"http://127.0.0.1:{port}", [], []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the server never answered"
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200 and lines:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url, stderr
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=30)
        stderr.append("".join(lines))


def test_alight_store_insecure_serves_with_a_warning() -> None:
    with serving(["store", "--insecure"], _env()) as (url, stderr):
        assert httpx.get(f"{url}/store/counts").status_code == 200
    assert "WARNING" in stderr[0] and "with no token (--insecure)" in stderr[0]


@pytest.mark.parametrize(
    "command",
    [
        ["store"],
        ["serve", "--engine", "litellm", "--model", "openai/m", "--base-url", "http://127.0.0.1:1/v1"],
    ],
)
def test_commands_with_alight_token_answer_401_and_never_print_it(command: list[str]) -> None:
    route = "/store/counts" if command[0] == "store" else "/v1/models"
    env = _env(ALIGHT_TOKEN=TOKEN, LITELLM_LOCAL_MODEL_COST_MAP="True")
    with serving(command, env) as (url, stderr):
        assert httpx.get(f"{url}{route}").status_code == 401
        assert httpx.get(f"{url}{route}", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{url}{route}", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert stderr[0] and TOKEN not in stderr[0]


# -- a whole run with the token on --------------------------------------------------------------


@pytest.mark.slow
def test_alight_dev_with_a_token_beyond_loopback_then_trace_the_store_by_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local stack with ALIGHT_TOKEN: store and proxy on 0.0.0.0 with the token, runners send
    it to the store, agents send it to the proxy as their api_key; the token is in no output."""
    from tests.cli.test_dev_and_trace import alight, write_config
    from tests.fixtures.openai_server import ScriptedOpenAIServer
    from tests.fixtures.sample_agents import calculator_script

    monkeypatch.setenv("ALIGHT_TOKEN", TOKEN)
    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(calculator_script) as upstream:
        done = alight(
            "dev", str(write_config(tmp_path)), "store.host=0.0.0.0", "proxy.host=0.0.0.0", "--n", "2",
            "--endpoint", upstream.url, "--model", "scripted", "--run-dir", str(run_dir), "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    assert [(row["status"], row["reward"], row["llm_calls"]) for row in rows] == [("succeeded", 1.0, 2)] * 2
    assert TOKEN not in done.stdout + done.stderr
    assert TOKEN not in "".join(path.read_text(errors="replace") for path in run_dir.rglob("*") if path.is_file())

    with StoreServer(MemoryStore(), host=ANY, token=TOKEN, watchdog_interval_s=None) as server:
        url = local(server.url)
        listed = alight("trace", url, "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout)["rollouts"] == [], listed.stderr
        monkeypatch.setenv("ALIGHT_TOKEN", "wrong")
        refused = alight("trace", url)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "token" in refused.stderr
