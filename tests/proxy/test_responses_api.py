"""The Responses API (`POST /v1/responses`) through the proxy: the stock openai client on the tiny
model and on `ScriptedEngine` (function calls, which the untrained tiny model cannot make), an
OpenAI Agents SDK agent on its default Responses model, and bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, get_args

import httpx
import openai
import pytest

from alight import semconv
from alight.engines.base import ChatRequest, StreamEvent, TextDelta
from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from alight.types import SpanKind, SpanStatus
from tests.proxy.conftest import new_attempt, spans_of
from tests.proxy.scripted import TEXT, ScriptedEngine

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ProxyServer]:
    engine = ScriptedEngine(tool_arguments={"add": {"a": 2, "b": 3}}, json_answer={"total": 5})
    with ProxyServer(Proxy(engine, MemoryStore(), default_sampling={"temperature": 0.25})) as server:
        yield server


def client(server: ProxyServer, rollout_id: str | None = None, attempt_id: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(rollout_id, attempt_id), api_key="alight", max_retries=0)


def test_tiny_model_answers_and_the_span_decodes_to_prompt_and_answer(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    answer = client(served, rid, aid).responses.create(
        model="tiny", instructions="Be brief.", input="What is 2+2?", max_output_tokens=12, temperature=0
    )
    [span] = spans_of(served, rid)
    a = span.attributes
    assert (span.kind, span.name, span.status) == (SpanKind.LLM, "llm.chat", SpanStatus.OK)
    assert a[semconv.LLM_API] == "responses" and a[semconv.LLM_STREAM] is False
    assert a[semconv.LLM_REQUEST_MESSAGES] == MESSAGES
    assert a[semconv.LLM_REQUEST_SAMPLING]["max_tokens"] == 12
    assert a[semconv.LLM_RESPONSE_MESSAGE]["content"] == answer.output_text
    assert answer.usage is not None and answer.usage.output_tokens == a[semconv.LLM_USAGE]["completion_tokens"]
    ended = a[semconv.LLM_FINISH_REASON] == "stop"
    assert answer.status == ("completed" if ended else "incomplete")
    assert answer.incomplete_details is None if ended else answer.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]

    tokenizer = served.proxy.engine.tokenizer  # type: ignore[attr-defined]
    prompt, response = a[semconv.LLM_PROMPT_TOKEN_IDS], a[semconv.LLM_RESPONSE_TOKEN_IDS]
    template = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    tail = tokenizer.decode(response[-1:]) if ended else ""  # the end-of-turn token, when generated
    assert tokenizer.decode(prompt + response) == template + answer.output_text + tail

    # streamed: the same answer as events, and the same tokens on the span
    events = list(
        client(served, rid, aid).responses.create(
            model="tiny",
            input=MESSAGES,
            max_output_tokens=12,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == TEXT_EVENTS[:4] and kinds[-5:] == [*TEXT_EVENTS[-4:], f"response.{answer.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == answer.output_text
    assert events[-1].response.output_text == answer.output_text  # type: ignore[union-attr]
    streamed = spans_of(served, rid)[1].attributes
    assert streamed[semconv.LLM_STREAM] is True and streamed[semconv.LLM_API] == "responses"
    assert streamed[semconv.LLM_RESPONSE_TOKEN_IDS] == response


def test_length_cut_answers_are_incomplete(served: ProxyServer) -> None:
    # greedy: a sampled answer of the untrained tiny model can end on its own within 2 tokens (a flake)
    answer = client(served).responses.create(model="tiny", input="Count to ten.", max_output_tokens=2, temperature=0)
    assert answer.status == "incomplete" and answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage is not None and answer.usage.output_tokens == 2


@pytest.mark.anyio
async def test_async_client(served: ProxyServer) -> None:
    rid, aid = new_attempt(served)
    async with openai.AsyncOpenAI(base_url=served.base_url(rid, aid), api_key="x", max_retries=0) as aclient:
        answer = await aclient.responses.create(model="tiny", input="Hi", max_output_tokens=6, temperature=0)
        deltas = []
        async for event in await aclient.responses.create(
            model="tiny", input="Hi", max_output_tokens=6, temperature=0, stream=True
        ):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            final = event
    assert "".join(deltas) == answer.output_text == final.response.output_text  # type: ignore[union-attr]
    assert final.type == f"response.{answer.status}"
    spans = spans_of(served, rid)
    assert [s.attributes[semconv.LLM_STREAM] for s in spans] == [False, True]


def test_function_calls_and_their_outputs(scripted: ProxyServer) -> None:
    rid, aid = new_attempt(scripted)
    openai_client = client(scripted, rid, aid)
    called = openai_client.responses.create(model="scripted", input="What is 2+3?", tools=[ADD])  # type: ignore[list-item]
    [call] = called.output
    assert call.type == "function_call" and (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 3})
    assert called.status == "completed" and called.output_text == ""

    history: list[Any] = ["What is 2+3?"]
    history = [{"role": "user", "content": history[0]}, call.model_dump(exclude_none=True)]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
    answer = openai_client.responses.create(model="scripted", input=history, tools=[ADD])  # type: ignore[list-item]
    assert answer.output_text == TEXT

    events = list(
        openai_client.responses.create(
            model="scripted",
            input="2+3?",
            tools=[ADD],
            tool_choice={"type": "function", "name": "add"},
            stream=True,  # type: ignore[list-item]
        )
    )
    assert [e.type for e in events] == CALL_EVENTS
    assert events[-1].response.output[0].arguments == '{"a": 2, "b": 3}'  # type: ignore[union-attr]
    with openai_client.responses.stream(model="scripted", input=history) as stream:  # the SDK's event accumulator
        assert stream.get_final_response().output_text == TEXT
    json_answer = openai_client.responses.create(
        model="scripted",
        input="2+3?",
        text={"format": {"type": "json_schema", "name": "Sum", "schema": {"type": "object"}, "strict": True}},
    )
    assert json.loads(json_answer.output_text) == {"total": 5}

    spans = spans_of(scripted, rid)
    assert [s.attributes[semconv.LLM_API] for s in spans] == ["responses"] * 5
    first, second = spans[0].attributes, spans[1].attributes
    assert first[semconv.LLM_REQUEST_TOOLS][0]["function"]["name"] == "add"
    recorded_call = first[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"][0]
    assert second[semconv.LLM_REQUEST_MESSAGES][1:] == [
        {"role": "assistant", "tool_calls": [recorded_call]},
        {"role": "tool", "tool_call_id": recorded_call["id"], "content": "5"},
    ]
    assert spans[2].attributes[semconv.LLM_REQUEST_SAMPLING]["tool_choice"] == {
        "type": "function",
        "function": {"name": "add"},
    }
    assert spans[3].attributes[semconv.LLM_REQUEST_MESSAGES] == second[semconv.LLM_REQUEST_MESSAGES]
    assert spans[4].attributes[semconv.LLM_REQUEST_SAMPLING]["response_format"]["json_schema"]["name"] == "Sum"


@pytest.fixture
def agents_sdk() -> Iterator[Any]:
    """The Agents SDK with trace export off (there is no network); its defaults are put back after."""
    agents = pytest.importorskip("agents")
    from agents.models import _openai_shared

    previous = _openai_shared.get_default_openai_client()
    agents.set_tracing_disabled(True)
    try:
        yield agents
    finally:
        agents.set_default_openai_client(previous, use_for_tracing=False)  # type: ignore[arg-type]
        agents.set_tracing_disabled(False)


@pytest.mark.anyio
async def test_openai_agents_sdk_default_responses_model(scripted: ProxyServer, agents_sdk: Any) -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    rid, aid = new_attempt(scripted)
    agent = agents_sdk.Agent(
        name="calculator", instructions="Use the tool.", tools=[agents_sdk.function_tool(add)], model="scripted"
    )
    async with openai.AsyncOpenAI(base_url=scripted.base_url(rid, aid), api_key="x", max_retries=0) as aclient:
        agents_sdk.set_default_openai_client(aclient, use_for_tracing=False)  # all a user has to do
        agents_sdk.set_default_openai_api("responses")
        result = await agents_sdk.Runner.run(agent, "What is 2+3?")
        streamed = agents_sdk.Runner.run_streamed(agent, "What is 2+3?")
        kinds = {event.type async for event in streamed.stream_events()}
    assert result.final_output == streamed.final_output == TEXT
    assert {"raw_response_event", "run_item_stream_event"} <= kinds
    spans = spans_of(scripted, rid)
    assert [s.attributes[semconv.LLM_STREAM] for s in spans] == [False, False, True, True]
    assert {s.attributes[semconv.LLM_API] for s in spans} == {"responses"}
    for first, second in (spans[:2], spans[2:]):
        messages = second.attributes[semconv.LLM_REQUEST_MESSAGES]
        assert messages[0] == {"role": "system", "content": "Use the tool."}
        [call] = first.attributes[semconv.LLM_RESPONSE_MESSAGE]["tool_calls"]
        assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
        assert messages[-2]["tool_calls"][0]["id"] == call["id"]
        assert messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": "5"}


OK: dict[str, Any] = {"model": "scripted", "input": "hi"}
BAD: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    # (case, changes to OK, param, code)
    (
        "web search tool",
        {"tools": [ADD, {"type": "web_search"}, {"type": "file_search"}]},
        "tools",
        "unsupported_value",
    ),
    ("previous_response_id", {"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ("conversation", {"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ("missing input", {"input": None}, "input", "missing_required_parameter"),
    ("input of the wrong type", {"input": 3}, "input", "invalid_value"),
    (
        "call without call_id",
        {"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]},
        "input[0].call_id",
        "missing_required_parameter",
    ),
    ("unknown item type", {"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "unsupported_value"),
    (
        "image part",
        {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "input[0].content[0].type",
        "unsupported_value",
    ),
    (
        "file output",
        {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
        "input[0].output[0].type",
        "unsupported_value",
    ),
    ("tool role message", {"input": [{"role": "tool", "content": "5"}]}, "input[0].role", "invalid_value"),
    ("tool name with spaces", {"tools": [{**ADD, "name": "my tool"}]}, "tools[0].name", "invalid_value"),
    ("unknown tool_choice", {"tools": [ADD], "tool_choice": {"type": "function", "name": "mul"}}, "tool_choice", None),
    ("max_output_tokens below 1", {"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
]


@pytest.mark.parametrize(("case", "changes", "param", "code"), BAD, ids=[case[0] for case in BAD])
def test_bad_requests(
    scripted: ProxyServer, case: str, changes: dict[str, Any], param: str | None, code: str | None
) -> None:
    body = {key: value for key, value in {**OK, **changes}.items() if value is not None}
    reply = httpx.post(f"{scripted.base_url()}/responses", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert "\n" not in error["message"]
    if case == "web search tool":
        assert "'file_search', 'web_search'" in error["message"]
    assert httpx.post(f"{scripted.base_url()}/responses", json=OK).json()["output"][0]["content"][0]["text"] == TEXT


def test_the_openai_client_sees_a_bad_request_error(scripted: ProxyServer) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client(scripted).responses.create(model="scripted", input="hi", previous_response_id="resp_1")


@pytest.mark.parametrize("stream", [False, True])
def test_the_wire_format_validates_against_openai_types(scripted: ProxyServer, stream: bool) -> None:
    """The SDK builds its objects without validation; here every object must pass openai's own models."""
    from openai.types.responses import Response, ResponseStreamEvent

    union = get_args(ResponseStreamEvent)[0]  # Annotated[Union[...], PropertyInfo(discriminator="type")]
    event_types = {get_args(kind.model_fields["type"].annotation)[0]: kind for kind in get_args(union)}

    body = {**OK, "tools": [ADD], "instructions": "Be brief.", "stream": stream, "metadata": {"k": "v"}, "store": True}
    for turn in (body, {**body, "tool_choice": "none"}):  # a function call, then text
        with httpx.stream("POST", f"{scripted.base_url()}/responses", json=turn) as reply:
            raw = reply.read()
        if not stream:
            answer = Response.model_validate_json(raw)
            assert (answer.status, answer.temperature, answer.metadata) == ("completed", 0.25, {"k": "v"})
            continue
        blocks = raw.decode().strip().split("\n\n")
        events = []
        for block in blocks:
            kind, data = block.split("\n")
            name = kind.removeprefix("event: ")
            event = event_types[name].model_validate_json(data.removeprefix("data: "))
            assert event.type == name
            events.append(event)
        assert isinstance(events[-1].response, Response)  # type: ignore[union-attr]
        assert events[-1].response.output == [e.item for e in events if e.type == "response.output_item.done"]  # type: ignore[union-attr]


class _DyingMidAnswer(ScriptedEngine):
    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("Hel")
        raise RuntimeError("the GPU caught fire")


def test_an_engine_failure_mid_stream_is_an_error_event_and_an_error_span() -> None:
    with ProxyServer(Proxy(_DyingMidAnswer(), MemoryStore())) as server:
        rid, aid = new_attempt(server)
        events = list(client(server, rid, aid).responses.create(model="scripted", input="hi", stream=True))
        assert [e.type for e in events[-2:]] == ["response.output_text.delta", "error"]
        assert "caught fire" in events[-1].message  # type: ignore[union-attr]
        [span] = spans_of(server, rid)
        assert (span.status, span.attributes[semconv.LLM_API]) == ("error", "responses")
        assert server.proxy.gate.in_flight == 0
