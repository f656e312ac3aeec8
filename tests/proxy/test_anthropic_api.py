"""Anthropic's Messages API (`POST /v1/messages`) through the proxy, spoken by the real `anthropic`
SDK: the tiny model (token ids on the span, stop reasons, streaming events), `ScriptedEngine` for
tool use (the untrained tiny model cannot call tools), and bad input answered in Anthropic's error
shape, which the SDK turns into its own typed errors. The last tests check the translation alone:
mixed text and tool results, custom tools, several stop sequences."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from alight import semconv
from alight.engines.base import ChatRequest, StreamEvent, TextDelta
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.types import SpanKind, SpanStatus
from tests.proxy.conftest import new_attempt, spans_of
from tests.proxy.scripted import TEXT, ScriptedEngine

anthropic = pytest.importorskip("anthropic")

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
QUESTION = [{"role": "user", "content": "What is 2+3?"}]
TEXT_EVENTS = ["message_start", "content_block_start", "content_block_delta"]
END_EVENTS = ["content_block_stop", "message_delta", "message_stop"]


def client(server: ProxyServer, rollout_id: str | None = None, attempt_id: str | None = None, **kw: Any) -> Any:
    """An Anthropic client on the proxy: the attempt's base URL without its `/v1`."""
    base_url = server.base_url(rollout_id, attempt_id).removesuffix("/v1")
    return anthropic.Anthropic(base_url=base_url, api_key=kw.pop("api_key", "alight"), max_retries=0, **kw)


@pytest.fixture(scope="module")
def scripted() -> Iterator[ProxyServer]:
    engine = ScriptedEngine(tool_arguments={"add": {"a": 2, "b": 3}})
    with ProxyServer(Proxy(engine, MemoryStore())) as server:
        yield server


def test_tiny_model_answers_and_the_span_holds_the_chat_call_with_token_ids(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    answer = client(served, rid, aid).messages.create(
        model="tiny", system="Be brief.", messages=QUESTION, max_tokens=12, extra_body={"temperature": 0}
    )
    assert (answer.type, answer.role, answer.model) == ("message", "assistant", "tiny")
    assert answer.id.startswith("msg_") and [block.type for block in answer.content] == ["text"]
    text = answer.content[0].text
    [span] = spans_of(served, rid)
    a = span.attributes
    assert (span.kind, span.name, span.status) == (SpanKind.LLM, "llm.chat", SpanStatus.OK)
    assert a[semconv.LLM_API] == "anthropic" and a[semconv.LLM_STREAM] is False
    messages = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert a[semconv.LLM_REQUEST_MESSAGES] == messages
    assert a[semconv.LLM_REQUEST_SAMPLING]["max_tokens"] == 12 and a[semconv.LLM_REQUEST_SAMPLING]["temperature"] == 0
    assert a[semconv.LLM_RESPONSE_MESSAGE]["content"] == text
    assert answer.usage.input_tokens == len(a[semconv.LLM_PROMPT_TOKEN_IDS])
    assert answer.usage.output_tokens == len(a[semconv.LLM_RESPONSE_TOKEN_IDS]) == len(a[semconv.LLM_RESPONSE_LOGPROBS])
    ended = a[semconv.LLM_FINISH_REASON] == "stop"
    assert answer.stop_reason == ("end_turn" if ended else "max_tokens") and answer.stop_sequence is None

    tokenizer = served.proxy.engine.tokenizer  # type: ignore[attr-defined]
    prompt, response = a[semconv.LLM_PROMPT_TOKEN_IDS], a[semconv.LLM_RESPONSE_TOKEN_IDS]
    template = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    tail = tokenizer.decode(response[-1:]) if ended else ""  # the end-of-turn token, when generated
    assert tokenizer.decode(prompt + response) == template + text + tail

    # streamed: the same answer as Anthropic's events, the same tokens on the span
    with client(served, rid, aid).messages.stream(
        model="tiny", system="Be brief.", messages=QUESTION, max_tokens=12, extra_body={"temperature": 0}
    ) as stream:
        kinds = [event.type for event in stream if event.type != "text"]  # "text": the SDK's own helper events
        final = stream.get_final_message()
    assert kinds[:3] == TEXT_EVENTS and kinds[-3:] == END_EVENTS
    assert [block.type for block in final.content] == ["text"] and final.content[0].text == text
    assert final.stop_reason == answer.stop_reason and final.usage.output_tokens == answer.usage.output_tokens
    assert final.usage.input_tokens == answer.usage.input_tokens  # sent in message_delta, once known
    streamed = spans_of(served, rid)[1].attributes
    assert streamed[semconv.LLM_STREAM] is True and streamed[semconv.LLM_API] == "anthropic"
    assert streamed[semconv.LLM_RESPONSE_TOKEN_IDS] == response


def test_stop_reasons_max_tokens_and_stop_sequence(served: ProxyServer) -> None:
    anthropic_client = client(served)
    cut = anthropic_client.messages.create(model="tiny", messages=QUESTION, max_tokens=2)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 2)

    seeded = {"seed": 7}  # sampled (greedy, the untrained model writes newlines) but the same every time
    full = anthropic_client.messages.create(model="tiny", messages=QUESTION, max_tokens=12, extra_body=seeded)
    text = full.content[0].text
    stop = next((text[i : i + 2] for i in range(2, len(text) - 2) if text.index(text[i : i + 2]) >= 2), None)
    assert stop is not None, f"the tiny model's answer is too short to pick a stop sequence from: {text!r}"
    stopped = anthropic_client.messages.create(
        model="tiny", messages=QUESTION, max_tokens=12, stop_sequences=["@@never@@", stop], extra_body=seeded
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert (stopped.content[0].text if stopped.content else "") == text[: text.index(stop)]


def test_tool_use_round_trip_and_the_recorded_chat_messages(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    sdk = client(scripted, rid, aid)
    first = sdk.messages.create(
        model="scripted",
        max_tokens=64,
        system=[{"type": "text", "text": "Use tools."}],
        messages=QUESTION,
        tools=[ADD],
        tool_choice={"type": "any"},
        metadata={"user_id": "u1"},
        extra_body={"temperature": 0.5, "top_k": 5},  # this SDK version has no arguments for them
    )
    assert first.stop_reason == "tool_use"
    [use] = first.content
    assert (use.type, use.name, use.input) == ("tool_use", "add", {"a": 2, "b": 3})
    history = [
        *QUESTION,
        {"role": "assistant", "content": first.content},  # the SDK's own blocks, sent back
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "5"}]},
                {"type": "text", "text": "Answer now."},
            ],
        },
    ]
    second = sdk.messages.create(
        model="scripted", max_tokens=64, messages=history, tools=[ADD], tool_choice={"type": "none"}
    )
    assert (second.stop_reason, [b.type for b in second.content]) == ("end_turn", ["text"])
    assert second.content[0].text == TEXT

    engine: ScriptedEngine = scripted.proxy.engine  # type: ignore[assignment]
    request = engine.requests[-2]
    function = {"name": "add", "description": ADD["description"], "parameters": ADD["input_schema"]}
    chat_add = {"type": "function", "function": function}
    assert request.tools == [chat_add] and request.tool_choice == "required"
    assert (request.sampling.temperature, request.sampling.max_tokens) == (0.5, 64)
    assert request.extra == {"top_k": 5}  # metadata is ignored, top_k goes to the engine
    spans = spans_of(scripted, rid)
    assert [s.attributes[semconv.LLM_FINISH_REASON] for s in spans] == ["tool_calls", "stop"]
    call = {"id": use.id, "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}
    assert spans[0].attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]["id"] == use.id
    assert spans[1].attributes[semconv.LLM_REQUEST_MESSAGES] == [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use.id, "content": "5"},
        {"role": "user", "content": "Answer now."},
    ]
    assert spans[1].attributes[semconv.LLM_REQUEST_TOOLS] == [chat_add]


def test_tool_choice_forms(scripted: ProxyServer) -> None:
    sdk = client(scripted)
    engine: ScriptedEngine = scripted.proxy.engine  # type: ignore[assignment]
    for choice, expected in (
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ):
        answer = sdk.messages.create(model="scripted", max_tokens=8, messages=QUESTION, tools=[ADD], tool_choice=choice)
        assert engine.requests[-1].tool_choice == expected
        assert answer.stop_reason == ("end_turn" if expected == "none" else "tool_use")


def test_streamed_tool_use_events_parse_in_the_sdk(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    with client(scripted, rid, aid).messages.stream(
        model="scripted", max_tokens=64, messages=QUESTION, tools=[ADD]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "input_json",  # the SDK's helper event for an input_json_delta
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = next(e for e in events if e.type == "content_block_delta")
    assert delta.delta.type == "input_json_delta" and json.loads(delta.delta.partial_json) == {"a": 2, "b": 3}
    [use] = final.content
    assert (use.type, use.name, use.input, final.stop_reason) == ("tool_use", "add", {"a": 2, "b": 3}, "tool_use")
    [span] = spans_of(scripted, rid)
    assert span.attributes[semconv.LLM_STREAM] is True
    assert span.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]["id"] == use.id


@pytest.mark.anyio
async def test_async_client_streams_text(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    base_url = served.base_url(rid, aid).removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0) as sdk:
        stream = await sdk.messages.create(model="tiny", messages=QUESTION, max_tokens=6, stream=True)
        texts = [e.delta.text async for e in stream if e.type == "content_block_delta"]
    [span] = spans_of(served, rid)
    assert "".join(texts) == span.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"]


# -- errors: Anthropic's shape on these routes, OpenAI's on the others ---------------------------


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    body = response.json()
    assert response.status_code == status and body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def test_bad_requests_are_anthropic_errors_the_sdk_raises_as_its_own(scripted: ProxyServer) -> None:
    sdk = client(scripted)
    with pytest.raises(anthropic.BadRequestError) as bad_role:
        sdk.messages.create(model="scripted", max_tokens=8, messages=[{"role": "system", "content": "x"}])
    assert bad_role.value.type == "invalid_request_error" and "messages[0].role" in str(bad_role.value.api_message)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.create(model="claude-nope", max_tokens=8, messages=QUESTION)
    assert unknown.value.type == "not_found_error" and "claude-nope" in str(unknown.value.api_message)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError, match="'image' are not supported"):
        sdk.messages.create(model="scripted", max_tokens=8, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="web_search_20250305"):
        search = {"type": "web_search_20250305", "name": "web_search"}
        sdk.messages.create(model="scripted", max_tokens=8, messages=QUESTION, tools=[search])
    with pytest.raises(anthropic.BadRequestError, match="unknown tool 'mul'"):
        sdk.messages.create(
            model="scripted", max_tokens=8, messages=QUESTION, tools=[ADD], tool_choice={"type": "tool", "name": "mul"}
        )

    url = scripted.base_url().removesuffix("/v1") + "/v1/messages"
    missing = httpx.post(url, json={"model": "scripted", "messages": QUESTION})
    assert "max_tokens" in anthropic_error(missing, 400, "invalid_request_error")
    assert "max_tokens" in anthropic_error(
        httpx.post(url, json={"model": "scripted", "max_tokens": 0, "messages": QUESTION}), 400, "invalid_request_error"
    )
    assert "JSON" in anthropic_error(httpx.post(url, content=b"{nope"), 400, "invalid_request_error")
    for not_a_list in (3.5, "hi", {"role": "user"}):  # a 400 naming the field, never a 500
        answer = httpx.post(url, json={"model": "scripted", "max_tokens": 8, "messages": not_a_list})
        assert "messages" in anthropic_error(answer, 400, "invalid_request_error")
    anthropic_error(httpx.get(url), 405, "invalid_request_error")
    # The OpenAI routes keep OpenAI's shape.
    openai_url = scripted.base_url() + "/chat/completions"
    body = httpx.post(openai_url, json={"model": "claude-nope", "messages": QUESTION}).json()
    assert body["error"]["code"] == "model_not_found" and "type" not in body


class FailingEngine(ScriptedEngine):
    """Fails every unstreamed call; streamed calls fail after their first piece of text."""

    async def chat(self, request: ChatRequest) -> Any:
        raise RuntimeError("the accelerator caught fire")

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("The ans")
        raise RuntimeError("the accelerator caught fire")


def test_engine_failures_are_api_errors_before_and_during_a_stream() -> None:
    with ProxyServer(Proxy(FailingEngine(), MemoryStore())) as server:
        rid, aid = new_attempt(server)
        sdk = client(server, rid, aid)
        with pytest.raises(anthropic.InternalServerError) as failed:
            sdk.messages.create(model="scripted", max_tokens=8, messages=QUESTION)
        assert failed.value.type == "api_error" and "caught fire" in str(failed.value.api_message)
        with (
            pytest.raises(anthropic.APIStatusError) as mid_stream,
            sdk.messages.stream(model="scripted", max_tokens=8, messages=QUESTION) as stream,
        ):
            list(stream)
        assert mid_stream.value.body["error"]["type"] == "api_error"  # type: ignore[index]
        spans = spans_of(server, rid)
        assert [s.status for s in spans] == [SpanStatus.ERROR, SpanStatus.ERROR]
        assert all("caught fire" in str(s.status_message) for s in spans)


def test_token_checked_as_bearer_or_x_api_key_with_anthropic_shaped_refusals() -> None:
    with ProxyServer(Proxy(ScriptedEngine(), MemoryStore()), token="s3cret") as server:
        assert client(server, api_key="s3cret").messages.create(model="scripted", max_tokens=8, messages=QUESTION)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client(server, api_key="wrong").messages.create(model="scripted", max_tokens=8, messages=QUESTION)
        assert refused.value.type == "authentication_error"
        url = server.base_url().removesuffix("/v1") + "/v1/messages"
        body = {"model": "scripted", "max_tokens": 8, "messages": QUESTION}
        assert httpx.post(url, json=body, headers={"x-api-key": "s3cret"}).status_code == 200
        anthropic_error(httpx.post(url, json=body, headers={"x-api-key": "nope"}), 401, "authentication_error")
        anthropic_error(httpx.post(url, json=body), 401, "authentication_error")
        openai_refusal = httpx.post(server.base_url() + "/chat/completions", json={}).json()
        assert openai_refusal["error"]["code"] == "unauthorized"


def test_a_base_url_with_v1_gets_a_not_found_that_says_what_to_pass(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    sdk = anthropic.Anthropic(base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0)  # the OpenAI one
    with pytest.raises(anthropic.NotFoundError, match="anthropic_base_url"):
        sdk.messages.create(model="scripted", max_tokens=8, messages=QUESTION)


def test_both_sdks_list_the_served_models(scripted: ProxyServer) -> None:
    [card] = client(scripted).models.list().data
    assert (card.id, card.type, card.display_name) == ("scripted", "model", "scripted")
    assert client(scripted).models.retrieve("scripted").id == "scripted"
    import openai

    assert [m.id for m in openai.OpenAI(base_url=scripted.base_url(), api_key="x").models.list()] == ["scripted"]


def test_the_llm_resource_gives_anthropic_clients_their_base_url() -> None:
    from alight.agent import LLM, attempt_base_url

    llm = LLM(model="m", base_url=attempt_base_url("http://127.0.0.1:9/", "ro-1", "at-1"))
    assert llm.anthropic_base_url == "http://127.0.0.1:9/rollout/ro-1/attempt/at-1"
    assert anthropic.Anthropic(base_url=llm.anthropic_base_url, api_key="x").base_url.path.endswith("/at-1/")


# -- the translation alone (no server): what the engine is asked, what the answer says ----------------
def test_a_user_turn_mixing_text_and_tool_results_keeps_its_order_in_the_chat_messages() -> None:
    """Text before, between and after two tool results: each run of text is one user message
    (adjacent text blocks joined) and each tool result a `tool` message, in the order sent."""
    from alight.proxy.anthropic_request import parse_body

    calls = [{"type": "tool_use", "id": f"t{i}", "name": "add", "input": {"a": i, "b": 1}} for i in (1, 2)]
    turn = [
        {"type": "text", "text": "Before. "},
        {"type": "text", "text": "Still before."},
        {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
        {"type": "text", "text": "Between."},
        {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "3"}]},
        {"type": "text", "text": "After."},
    ]
    body = {"model": "m", "max_tokens": 8, "messages": [*QUESTION, {"role": "assistant", "content": calls}]}
    request = parse_body({**body, "messages": [*body["messages"], {"role": "user", "content": turn}]}).to_request()
    assert request.messages[2:] == [
        {"role": "user", "content": "Before. Still before."},
        {"role": "tool", "tool_call_id": "t1", "content": "2"},
        {"role": "user", "content": "Between."},
        {"role": "tool", "tool_call_id": "t2", "content": "3"},
        {"role": "user", "content": "After."},
    ]


def test_custom_and_untyped_tools_become_function_tools() -> None:
    """A tool typed "custom" and one with no type are both client tools: chat function tools with
    the input schema as parameters (a missing description stays missing)."""
    from alight.proxy.anthropic_request import parse_body

    mul = {"name": "mul", "input_schema": {"type": "object", "properties": {"x": {"type": "number"}}}}
    tools = [{"type": "custom", **ADD}, mul]
    request = parse_body({"model": "m", "max_tokens": 8, "messages": QUESTION, "tools": tools}).to_request()
    assert request.tools == [
        {
            "type": "function",
            "function": {"name": "add", "description": ADD["description"], "parameters": ADD["input_schema"]},
        },
        {"type": "function", "function": {"name": "mul", "parameters": mul["input_schema"]}},
    ]


def test_every_stop_sequence_reaches_the_engine_and_the_answer_names_the_one_that_matched() -> None:
    """Three stop sequences all go to the engine as `stop`, in order; the answer's stop_sequence is
    the one the text after the answer begins with (the earliest there), not the first listed."""
    from alight.engines.base import Generation
    from alight.proxy.anthropic_api import stop_of
    from alight.proxy.anthropic_request import parse_body

    stops = ["##", "\n\nHuman:", "END"]
    body = {"model": "m", "max_tokens": 8, "messages": QUESTION, "stop_sequences": stops}
    assert parse_body(body).to_request().sampling.stop == stops

    def ended(after: str) -> tuple[str, str | None]:
        generation = Generation("m", "The sum is 5", {"role": "assistant"}, "stop", response_token_ids=[1, 2, 3])
        return stop_of(generation, stops, lambda ids: ["The sum ", "is 5", after])

    assert ended("END ## more") == ("stop_sequence", "END")
    assert ended("##END") == ("stop_sequence", "##")
    assert ended("\n\nHuman: hi ##") == ("stop_sequence", "\n\nHuman:")
    assert ended("<|im_end|>") == ("end_turn", None)  # an end-of-turn token, no stop sequence
