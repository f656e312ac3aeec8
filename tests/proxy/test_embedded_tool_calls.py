"""A real tool call from the embedded engine through the proxy: the tiny model overfit on one tool
call (the engines tests' `overfit`), loaded with `Proxy.update_weights`, asked by the stock
`openai` client, streamed and not."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from alight import semconv
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

pytest.importorskip("torch")


@pytest.mark.slow
def test_overfit_tool_call_through_the_proxy(tiny_dir: Path) -> None:
    from alight.chat_template import render_prompt
    from alight.engines.embedded import EmbeddedEngine
    from tests.engines.test_embedded_tool_calls import MESSAGES, TARGET, TOOLS, overfit

    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=120, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore())) as server:
        weights = overfit(tiny_dir, render_prompt(engine.tokenizer, MESSAGES, TOOLS))
        server.update_weights(weights, 1)
        rid, aid = new_attempt(server)
        llm = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0)
        kwargs = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "temperature": 0}
        whole = llm.chat.completions.create(**kwargs)  # type: ignore[call-overload]
        choice = whole.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Adding."
        [call] = choice.message.tool_calls
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}

        chunks = list(llm.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Adding."  # the markup is never streamed as content
        calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert calls[0].function.name == "add" and json.loads(calls[1].function.arguments) == {"a": 2, "b": 3}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

        unstreamed, streamed = spans_of(server, rid)
        for span in (unstreamed, streamed):
            a = span.attributes
            assert a[semconv.RESOURCES_VERSION] == 1 and a[semconv.LLM_FINISH_REASON] == "tool_calls"
            assert engine.tokenizer.decode(a[semconv.LLM_RESPONSE_TOKEN_IDS]) == TARGET
            assert a[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]["function"]["name"] == "add"
        for key in (semconv.LLM_PROMPT_TOKEN_IDS, semconv.LLM_RESPONSE_TOKEN_IDS, semconv.LLM_RESPONSE_LOGPROBS):
            assert streamed.attributes[key] == unstreamed.attributes[key]
