"""Every way the openai SDK makes an LLM call, inside an attempt, against the scripted server on
loopback and a real store: a call to a proxy-shaped URL carries the attempt's headers (one
sequence number per call), a call to any other endpoint is recorded as one client LLM span."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pydantic
import pytest

from alight import semconv
from alight.store import MemoryStore
from alight.tracing import AttemptContext, Tracer, agent_scope
from alight.types import Span, SpanKind, SpanStatus
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, with_crashes
from tests.tracing.conftest import new_claim

ANSWER = '{"value": 3}'
MESSAGES = [{"role": "user", "content": "What is 1 + 2?"}]


class Sum(pydantic.BaseModel):
    value: int


def always(request: dict[str, Any]) -> dict[str, Any]:
    return answer(ANSWER)


@contextlib.asynccontextmanager
async def attempt(tracer: Tracer, store: MemoryStore, agent_name: str = "agent") -> AsyncIterator[AttemptContext]:
    claim = await new_claim(store)
    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name=agent_name) as ctx:
        yield ctx


def proxy_url(server: ScriptedOpenAIServer, ctx: AttemptContext) -> str:
    return server.proxy_url(ctx.rollout_id, ctx.attempt_id)


# -- every method, sync and async: (method name, what the span's answer holds) ------------------


def sync_calls(client: openai.OpenAI, planner: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
    """Eleven calls, the last six inside an agent scope named "planner"."""
    chat = client.chat.completions
    chat.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    for _ in chat.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        pass
    assert chat.parse(model="m", messages=MESSAGES, response_format=Sum).choices[0].message.parsed == Sum(value=3)  # type: ignore[arg-type]
    chat.with_raw_response.create(model="m", messages=MESSAGES).parse()  # type: ignore[arg-type]
    chat.with_raw_response.parse(model="m", messages=MESSAGES, response_format=Sum).parse()  # type: ignore[arg-type]
    with planner():
        with chat.with_streaming_response.create(model="m", messages=MESSAGES) as response:  # type: ignore[arg-type]
            response.parse()
        with chat.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
            stream.get_final_completion()
        with client.beta.chat.completions.stream(model="m", messages=MESSAGES, response_format=Sum) as stream:  # type: ignore[arg-type]
            assert stream.get_final_completion().choices[0].message.parsed == Sum(value=3)
        assert client.completions.create(model="m", prompt="1 + 2 =").choices[0].text == ANSWER
        assert "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="1 +", stream=True))
        client.responses.create(model="m", input="What is 1 + 2?")


async def async_calls(
    client: openai.AsyncOpenAI, planner: Callable[[], contextlib.AbstractContextManager[None]]
) -> None:
    """The same eleven calls on the async client."""
    chat = client.chat.completions
    await chat.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    async for _ in await chat.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
        pass
    parsed = await chat.parse(model="m", messages=MESSAGES, response_format=Sum)  # type: ignore[arg-type]
    assert parsed.choices[0].message.parsed == Sum(value=3)
    (await chat.with_raw_response.create(model="m", messages=MESSAGES)).parse()  # type: ignore[arg-type]
    (await chat.with_raw_response.parse(model="m", messages=MESSAGES, response_format=Sum)).parse()  # type: ignore[arg-type]
    with planner():
        async with chat.with_streaming_response.create(model="m", messages=MESSAGES) as response:  # type: ignore[arg-type]
            await response.parse()
        async with chat.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
            await stream.get_final_completion()
        async with client.beta.chat.completions.stream(model="m", messages=MESSAGES, response_format=Sum) as stream:  # type: ignore[arg-type]
            assert (await stream.get_final_completion()).choices[0].message.parsed == Sum(value=3)
        assert (await client.completions.create(model="m", prompt="1 + 2 =")).choices[0].text == ANSWER
        assert [c async for c in await client.completions.create(model="m", prompt="1 +", stream=True)]
        await client.responses.create(model="m", input="What is 1 + 2?")


async def run_calls(
    tracer: Tracer, store: MemoryStore, *, use_async: bool, proxy: bool
) -> tuple[ScriptedOpenAIServer, list[Span]]:
    with ScriptedOpenAIServer(always) as server:
        async with attempt(tracer, store) as ctx:
            base_url = proxy_url(server, ctx) if proxy else server.url
            planner = lambda: agent_scope("planner")  # noqa: E731
            if use_async:
                async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as aclient:
                    await async_calls(aclient, planner)
            else:
                with openai.OpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
                    sync_calls(client, planner)
        return server, await store.query_spans(ctx.rollout_id, ctx.attempt_id)


@pytest.mark.anyio
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_every_method_to_a_proxy_url_carries_the_headers(tracer: Tracer, use_async: bool) -> None:
    server, spans = await run_calls(tracer, MemoryStore(), use_async=use_async, proxy=True)
    # The proxy writes the LLM spans: the client records only the agents.
    assert [(span.kind, span.name, span.sequence_id) for span in spans] == [
        (SpanKind.AGENT, "agent", 1),
        (SpanKind.AGENT, "planner", 7),
    ]
    root, planner = spans
    headers = [request.headers for request in server.requests]
    assert len(headers) == 11
    assert [int(h[semconv.HEADER_SEQUENCE_ID]) for h in headers] == [2, 3, 4, 5, 6, *range(8, 14)]
    for i, h in enumerate(headers):
        agent = root if i < 5 else planner
        assert h[semconv.HEADER_AGENT_NAME] == agent.name
        assert h[semconv.HEADER_PARENT_SPAN_ID] == agent.span_id
        assert h[semconv.HEADER_TRACE_ID] == agent.trace_id
    assert {request.rollout_id for request in server.requests} == {root.rollout_id}
    assert server.requests[-1].path.endswith("/v1/responses")


@pytest.mark.anyio
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_every_method_to_another_endpoint_is_one_client_span(tracer: Tracer, use_async: bool) -> None:
    server, spans = await run_calls(tracer, MemoryStore(), use_async=use_async, proxy=False)
    assert not any(key.startswith("x-alight") for request in server.requests for key in request.headers)
    llm = [span for span in spans if span.kind is SpanKind.LLM]
    # Ten calls recorded; the Responses API call is not (its span comes only from the proxy).
    assert [span.name for span in llm] == ["llm.chat"] * 8 + ["llm.completion"] * 2
    assert [span.sequence_id for span in spans] == list(range(1, 13))
    planner = next(span for span in spans if span.name == "planner")
    for i, span in enumerate(llm):
        attrs = span.attributes
        assert span.status is SpanStatus.OK and span.end_time is not None, span.name
        assert attrs[semconv.LLM_SOURCE] == "client" and attrs[semconv.LLM_REQUEST_MODEL] == "m"
        assert attrs[semconv.AGENT_NAME] == ("agent" if i < 5 else "planner")
        assert span.parent_id == (spans[0].span_id if i < 5 else planner.span_id)
        if span.name == "llm.chat":  # parsed answers and stream helpers: the assembled message
            assert attrs[semconv.LLM_RESPONSE_MESSAGE] == {"role": "assistant", "content": ANSWER}
            assert attrs[semconv.LLM_REQUEST_MESSAGES] == MESSAGES
            assert attrs[semconv.LLM_FINISH_REASON] == "stop"
        else:
            assert attrs[semconv.LLM_RESPONSE_TEXT] == ANSWER
            assert attrs[semconv.LLM_REQUEST_PROMPT] in ("1 + 2 =", "1 +")
    streamed = [span.attributes[semconv.LLM_STREAM] for span in llm]
    assert streamed == [False, True, False, False, False, False, True, True, False, True]
    assert llm[0].attributes[semconv.LLM_USAGE]["total_tokens"] == 15
    assert llm[8].attributes[semconv.LLM_USAGE]["total_tokens"] == 15


@pytest.mark.anyio
async def test_streams_dropped_early_end_their_spans(tracer: Tracer) -> None:
    store = MemoryStore()
    with ScriptedOpenAIServer(always) as server:
        async with attempt(tracer, store) as ctx:
            with openai.OpenAI(base_url=server.url, api_key="x") as client:
                with client.chat.completions.stream(model="m", messages=MESSAGES) as stream:  # type: ignore[arg-type]
                    for _ in stream:
                        break
                with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
                    pass  # never read
            aclient = openai.AsyncOpenAI(base_url=server.url, api_key="x")
            async with aclient, aclient.chat.completions.stream(model="m", messages=MESSAGES) as astream:  # type: ignore[arg-type]
                async for _ in astream:
                    break
            # Still referenced here: the spans ended when the responses closed, not when collected.
            finished = ctx.take_finished()
            assert stream is not None and astream is not None
    assert [(span.name, span.status) for span in finished] == [("llm.chat", SpanStatus.OK)] * 3
    assert finished[0].attributes[semconv.LLM_RESPONSE_MESSAGE]["role"] == "assistant"


@pytest.mark.anyio
async def test_a_retried_call_keeps_its_sequence_number(tracer: Tracer) -> None:
    script = with_crashes(None, answer("ok"), answer("ok"))

    with ScriptedOpenAIServer(script) as server:
        async with attempt(tracer, MemoryStore()) as ctx:
            with openai.OpenAI(base_url=proxy_url(server, ctx), api_key="x", max_retries=1) as client:
                client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert [r.headers[semconv.HEADER_SEQUENCE_ID] for r in server.requests] == ["2", "2", "3"]
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "0"]


@pytest.mark.anyio
async def test_ids_in_headers_make_a_proxy_call_and_a_given_sequence_is_kept(tracer: Tracer) -> None:
    store = MemoryStore()
    with ScriptedOpenAIServer(always) as server:
        async with attempt(tracer, store) as ctx:
            ids = {semconv.HEADER_ROLLOUT_ID: ctx.rollout_id, semconv.HEADER_ATTEMPT_ID: ctx.attempt_id}
            with openai.OpenAI(base_url=server.url, api_key="x", default_headers=ids) as client:
                client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                client.completions.create(model="m", prompt="hi", extra_headers={semconv.HEADER_SEQUENCE_ID: "42"})
                client.responses.create(model="m", input="hi")
        spans = await store.query_spans(ctx.rollout_id, ctx.attempt_id)
    assert [span.kind for span in spans] == [SpanKind.AGENT]
    assert [r.headers[semconv.HEADER_SEQUENCE_ID] for r in server.requests] == ["2", "42", "3"]
    assert all(r.headers[semconv.HEADER_AGENT_NAME] == "agent" for r in server.requests)


# -- LangChain structured output in a LangGraph node ----------------------------------------------


async def structured_graph(base_url: str) -> Sum:
    """One LangGraph node, "extractor", asking ChatOpenAI for a `Sum` (with_structured_output)."""
    from typing import TypedDict

    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    State = TypedDict("State", {"question": str, "answer": Sum | None})  # noqa: UP013
    model = ChatOpenAI(model="m", base_url=base_url, api_key="x")  # type: ignore[arg-type]

    async def extractor(state: State) -> State:
        result = await model.with_structured_output(Sum).ainvoke(state["question"])
        return {"question": state["question"], "answer": result}  # type: ignore[typeddict-item]

    graph = StateGraph(State)
    graph.add_node("extractor", extractor)
    graph.add_edge(START, "extractor")
    graph.add_edge("extractor", END)
    result = await graph.compile().ainvoke({"question": "What is 1 + 2?", "answer": None})
    await model.root_async_client.close()  # type: ignore[union-attr]
    return result["answer"]  # type: ignore[no-any-return]


@pytest.mark.anyio
@pytest.mark.parametrize("proxy", [True, False], ids=["proxy", "other"])
async def test_langchain_structured_output_in_a_langgraph_node(tracer: Tracer, proxy: bool) -> None:
    store = MemoryStore()
    with ScriptedOpenAIServer(always) as server:
        async with attempt(tracer, store, "graph_agent") as ctx:
            assert await structured_graph(proxy_url(server, ctx) if proxy else server.url) == Sum(value=3)
        spans = await store.query_spans(ctx.rollout_id, ctx.attempt_id)
    (request,) = server.requests
    assert request.body["response_format"]["type"] == "json_schema"  # the parse() path
    node = next(span for span in spans if span.name == "extractor")
    assert node.kind is SpanKind.AGENT
    llm = [span for span in spans if span.kind is SpanKind.LLM]
    if proxy:
        assert request.headers[semconv.HEADER_AGENT_NAME] == "extractor"
        assert request.headers[semconv.HEADER_PARENT_SPAN_ID] == node.span_id
        assert int(request.headers[semconv.HEADER_SEQUENCE_ID]) == node.sequence_id + 1
        assert llm == []
    else:
        assert not any(key.startswith("x-alight") for key in request.headers)
        (span,) = llm
        assert span.attributes[semconv.AGENT_NAME] == "extractor" and span.parent_id == node.span_id
        assert span.attributes[semconv.LLM_RESPONSE_MESSAGE]["content"] == ANSWER
