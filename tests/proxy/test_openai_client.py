"""The stock `openai` client against the proxy in front of the embedded tiny engine, with a real store."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from alight import semconv
from alight.proxy import ProxyServer
from alight.types import SpanKind, SpanStatus
from tests.proxy.conftest import new_attempt, spans_of

torch = pytest.importorskip("torch")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def client(server: ProxyServer, rollout_id: str | None = None, attempt_id: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(rollout_id, attempt_id), api_key="alight", max_retries=0)


def forward_logprobs(server: ProxyServer, prompt: list[int], response: list[int]) -> Any:
    model = server.proxy.engine.model  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_chat_records_one_span_with_ids_that_decode_to_prompt_and_answer(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    headers = {semconv.HEADER_AGENT_NAME: "solver", semconv.HEADER_SEQUENCE_ID: "7"}
    answer = client(served, rid, aid).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    [span] = spans_of(served, rid)
    a = span.attributes
    assert (span.kind, span.name, span.status, span.sequence_id) == (SpanKind.LLM, "llm.chat", SpanStatus.OK, 7)
    assert span.attempt_id == aid
    assert a[semconv.LLM_SOURCE] == "proxy" and a[semconv.AGENT_NAME] == "solver"
    assert a[semconv.LLM_REQUEST_MESSAGES] == MESSAGES
    assert a[semconv.LLM_REQUEST_SAMPLING]["max_tokens"] == 12 and a[semconv.LLM_REQUEST_SAMPLING]["temperature"] == 0
    assert a[semconv.LLM_RESPONSE_MESSAGE]["content"] == answer.choices[0].message.content
    assert a[semconv.LLM_FINISH_REASON] == answer.choices[0].finish_reason
    assert a[semconv.RESOURCES_VERSION] == 0 and a[semconv.LLM_STREAM] is False
    assert a[semconv.LLM_USAGE]["completion_tokens"] == answer.usage.completion_tokens  # type: ignore[union-attr]
    assert a[semconv.LLM_LATENCY_S] > 0 and a[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"

    tokenizer = served.proxy.engine.tokenizer  # type: ignore[attr-defined]
    prompt, response = a[semconv.LLM_PROMPT_TOKEN_IDS], a[semconv.LLM_RESPONSE_TOKEN_IDS]
    template = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ended = a[semconv.LLM_FINISH_REASON] == "stop"
    tail = tokenizer.decode(response[-1:]) if ended else ""  # the end-of-turn token, when generated
    assert tokenizer.decode(prompt + response) == template + answer.choices[0].message.content + tail
    expected = forward_logprobs(served, prompt, response)
    assert torch.allclose(torch.tensor(a[semconv.LLM_RESPONSE_LOGPROBS]), expected, atol=1e-4)


def test_headers_carry_ids_for_clients_that_cannot_change_the_path(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    headers = {
        semconv.HEADER_ROLLOUT_ID: rid,
        semconv.HEADER_ATTEMPT_ID: aid,
        semconv.HEADER_PARENT_SPAN_ID: "00f067aa0ba902b7",
        semconv.HEADER_TRACE_ID: "4bf92f3577b34da6a3ce929d0e0e4736",
    }
    plain = openai.OpenAI(base_url=served.base_url(), api_key="x", default_headers=headers, max_retries=0)
    plain.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    [span] = spans_of(served, rid)
    assert (span.attempt_id, span.parent_id, span.trace_id) == (
        aid,
        headers[semconv.HEADER_PARENT_SPAN_ID],
        headers[semconv.HEADER_TRACE_ID],
    )
    assert span.sequence_id == 1  # no sequence header: the store numbers it


def test_calls_without_ids_or_for_unknown_attempts_are_served(served: ProxyServer) -> None:
    answer = client(served).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.completion_tokens == 2
    failed = served.proxy.recorder.failed
    unknown = client(served, "ro-nope", "at-nope").chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=2,  # type: ignore[arg-type]
    )
    assert unknown.choices[0].message.content is not None
    served.flush()
    assert served.proxy.recorder.failed == failed + 1  # logged, not returned


def test_logprobs_and_token_ids_in_the_response(served: ProxyServer) -> None:
    answer = client(served).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,  # type: ignore[arg-type]
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    ext = answer.model_extra["alight"]  # type: ignore[index]
    assert [item.logprob for item in choice.logprobs.content] == ext["response_logprobs"]
    assert len(ext["response_token_ids"]) == 6 and ext["prompt_token_ids"]
    assert all(item.top_logprobs == [] for item in choice.logprobs.content)  # top_logprobs: not supported
    assert "".join(item.token for item in choice.logprobs.content) == choice.message.content
    plain = client(served).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None and "alight" not in (plain.model_extra or {})


def test_streaming_span_equals_the_unstreamed_span(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    llm = client(served, rid, aid)
    kwargs: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 10, "temperature": 0}
    whole = llm.chat.completions.create(**kwargs)
    chunks = list(
        llm.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}, logprobs=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    streamed_logprobs = [
        t.logprob for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []
    ]

    unstreamed, streamed = spans_of(served, rid)
    assert streamed.attributes[semconv.LLM_STREAM] is True
    assert streamed_logprobs == streamed.attributes[semconv.LLM_RESPONSE_LOGPROBS]
    ignore = {semconv.LLM_STREAM, semconv.LLM_LATENCY_S}
    assert {k: v for k, v in streamed.attributes.items() if k not in ignore} == {
        k: v for k, v in unstreamed.attributes.items() if k not in ignore
    }


@pytest.mark.anyio
async def test_async_client_concurrent_calls_each_get_their_span(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    async with openai.AsyncOpenAI(base_url=served.base_url(rid, aid), api_key="x", max_retries=0) as llm:
        prompts = [f"Question {i}?" for i in range(6)]

        async def ask(i: int, prompt: str) -> str:
            answer = await llm.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=5, temperature=0,
                extra_headers={semconv.HEADER_SEQUENCE_ID: str(i + 1)},
            )  # fmt: skip
            return answer.choices[0].message.content or ""

        answers = await asyncio.gather(*(ask(i, p) for i, p in enumerate(prompts)))
        stream = await llm.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "more"}], max_tokens=4, stream=True,
            extra_headers={semconv.HEADER_SEQUENCE_ID: "7"},
        )  # fmt: skip
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await served.proxy.flush()  # from this loop: hops onto the proxy's
        spans = spans_of(served, rid)
        assert [s.sequence_id for s in spans] == list(range(1, 8))
        assert [s.attributes[semconv.LLM_REQUEST_MESSAGES][0]["content"] for s in spans[:6]] == prompts
        assert [s.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"] for s in spans] == [*answers, streamed]


def test_completions_and_models(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    llm = client(served, rid, aid)
    answer = llm.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=1)
    assert answer.object == "text_completion" and answer.usage is not None and answer.usage.completion_tokens == 5
    assert answer.choices[0].logprobs is not None and len(answer.choices[0].logprobs.tokens or []) == 5
    pieces = list(
        llm.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == answer.choices[0].text
    spans = spans_of(served, rid)
    assert [s.name for s in spans] == ["llm.completion", "llm.completion"]
    assert spans[0].attributes[semconv.LLM_REQUEST_PROMPT] == "Once upon a time"
    assert spans[0].attributes[semconv.LLM_RESPONSE_TEXT] == answer.choices[0].text
    assert [m.id for m in llm.models.list()] == ["tiny"]
    assert llm.models.retrieve("tiny").id == "tiny"
