"""The proxy's default sampling: what the trainer configures applies to calls that set nothing."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from alight import semconv
from alight.errors import ConfigError
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of


def test_defaults_fill_only_what_the_request_leaves_out(tiny_dir: Path) -> None:
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=64, batch_wait_ms=1)
    defaults = {"temperature": 0.0, "max_tokens": 3, "seed": 5}
    with ProxyServer(Proxy(engine, MemoryStore(), default_sampling=defaults)) as server:
        rid, aid = new_attempt(server)
        client = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x")
        messages = [{"role": "user", "content": "hello"}]
        client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=1.0)  # type: ignore[arg-type]
        first, second = spans_of(server, rid)
    assert first.attributes[semconv.LLM_REQUEST_SAMPLING]["temperature"] == 0.0
    assert len(first.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]) <= 3
    assert second.attributes[semconv.LLM_REQUEST_SAMPLING]["temperature"] == 1.0
    assert (
        3 < len(second.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]) <= 5
        or second.attributes[semconv.LLM_FINISH_REASON] == "stop"
    )


def test_unknown_default_is_a_config_error(tiny_dir: Path) -> None:
    from alight.engines.embedded import EmbeddedEngine

    with pytest.raises(ConfigError, match="default_sampling"):
        Proxy(EmbeddedEngine("tiny", cache_dir=tiny_dir), default_sampling={"temprature": 0.5})
