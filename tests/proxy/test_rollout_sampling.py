"""Per-rollout sampling through a real proxy and the tiny engine: validation rollouts run greedy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from alight import semconv
from alight.errors import ConfigError
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

MESSAGES = [{"role": "user", "content": "Say something long."}]


@pytest.fixture(scope="module")
def server(tiny_dir: Path) -> Iterator[ProxyServer]:
    """The trainer's default sampling (temperature 1, at most 6 tokens) in front of the tiny engine."""
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=32, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore(), default_sampling={"temperature": 1.0, "max_tokens": 6})) as served:
        yield served


def chat(server: ProxyServer, rollout_id: str, attempt_id: str, **sampling: Any) -> None:
    client = openai.OpenAI(base_url=server.base_url(rollout_id, attempt_id), api_key="x")
    client.chat.completions.create(model="tiny", messages=MESSAGES, **sampling)  # type: ignore[arg-type]


def calls(server: ProxyServer, rollout_id: str) -> list[tuple[dict[str, Any], list[int]]]:
    """(sampling the engine got, tokens it generated) of each call of the rollout, in order."""
    spans = sorted(spans_of(server, rollout_id), key=lambda s: s.start_time)
    return [
        (s.attributes[semconv.LLM_REQUEST_SAMPLING], list(s.attributes[semconv.LLM_RESPONSE_TOKEN_IDS])) for s in spans
    ]


def test_a_greedy_rollout_answers_the_same_prompt_identically(server: ProxyServer) -> None:
    rid, aid = new_attempt(server)
    other_rid, other_aid = new_attempt(server)
    server.proxy.set_rollout_sampling([rid], {"temperature": 0})
    try:
        chat(server, rid, aid)
        chat(server, rid, aid)
        chat(server, rid, aid, temperature=1.0, top_p=0.9)  # what the request sets still wins
        chat(server, other_rid, other_aid)  # other rollouts keep the default
    finally:
        server.proxy.set_rollout_sampling([rid], None)
    (first, first_ids), (second, second_ids), (asked, _) = calls(server, rid)
    assert first["temperature"] == second["temperature"] == 0
    assert first_ids == second_ids
    assert 0 < len(first_ids) <= 6  # the rest of the default (max_tokens) still applies
    assert (asked["temperature"], asked["top_p"]) == (1.0, 0.9)
    [(other, _)] = calls(server, other_rid)
    assert other["temperature"] == 1.0


def test_unregistering_restores_the_default(server: ProxyServer) -> None:
    rid, aid = new_attempt(server)
    server.proxy.set_rollout_sampling([rid], {"temperature": 0.0, "max_tokens": 2})
    assert server.proxy.sampling_for(rid) == {"temperature": 0.0, "max_tokens": 2}
    chat(server, rid, aid)
    server.proxy.set_rollout_sampling([rid], None)
    server.proxy.set_rollout_sampling(["never-registered"], None)  # forgetting an unknown id is harmless
    assert server.proxy.sampling_for(rid) == {"temperature": 1.0, "max_tokens": 6}
    chat(server, rid, aid)
    (greedy, greedy_ids), (default, _) = calls(server, rid)
    assert (greedy["temperature"], greedy["max_tokens"], len(greedy_ids) <= 2) == (0.0, 2, True)
    assert (default["temperature"], default["max_tokens"]) == (1.0, 6)


def test_completions_follow_the_rollout_s_sampling_too(server: ProxyServer) -> None:
    rid, aid = new_attempt(server)
    server.proxy.set_rollout_sampling([rid], {"temperature": 0})
    try:
        client = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x")
        texts = [client.completions.create(model="tiny", prompt="Once upon").choices[0].text for _ in range(2)]
    finally:
        server.proxy.set_rollout_sampling([rid], None)
    assert texts[0] == texts[1]
    assert [sampling["temperature"] for sampling, _ in calls(server, rid)] == [0, 0]


def test_unknown_sampling_keys_are_config_errors(server: ProxyServer) -> None:
    with pytest.raises(ConfigError, match="rollout sampling"):
        server.proxy.set_rollout_sampling(["ro-x"], {"temperature": 0, "temprature": 0})
    assert server.proxy.sampling_for("ro-x") == server.proxy.default_sampling  # nothing half-registered


def test_none_values_keep_the_default(server: ProxyServer) -> None:
    server.proxy.set_rollout_sampling(["ro-none"], {"temperature": None, "max_tokens": 3})
    try:
        assert server.proxy.sampling_for("ro-none") == {"temperature": 1.0, "max_tokens": 3}
    finally:
        server.proxy.set_rollout_sampling(["ro-none"], None)
