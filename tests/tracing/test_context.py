"""The attempt context: emit_* from anywhere inside a rollout, agent scopes, flushing, errors."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from alight import semconv
from alight.store import MemoryStore
from alight.tracing import Tracer, agent_scope, current_attempt, emit_exception, emit_reward, emit_tool, make_tracer
from alight.tracing import context as tracing_context
from alight.types import SpanKind, SpanStatus
from tests.tracing.conftest import new_claim


def test_outside_an_attempt_emits_warn_once_and_do_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tracing_context._warned.clear()
    with caplog.at_level(logging.WARNING, logger="alight.tracing.context"):
        emit_reward(1.0)
        emit_reward(2.0)
        emit_tool("t")
        emit_exception(ValueError("x"))
        with agent_scope("nobody"):
            pass
    assert current_attempt() is None
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3 and "emit_reward called outside a rollout" in messages[0]


@pytest.mark.anyio
async def test_emits_from_threads_and_tasks_land_in_the_attempt(tracer: Tracer) -> None:
    store = MemoryStore()
    claim = await new_claim(store)
    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="main") as ctx:
        assert current_attempt() is ctx
        assert (ctx.rollout_id, ctx.attempt_id) == (claim.rollout.rollout_id, claim.attempt.attempt_id)
        await asyncio.to_thread(emit_reward, 0.25, "thread")
        await asyncio.create_task(asyncio.to_thread(emit_tool, "grep", {"pattern": "x"}, "found", exit_status=1))
        with agent_scope("helper"):
            emit_reward(0.75)
        assert ctx.rewards == [0.25, 0.75] and ctx.last_reward == 0.75
        await ctx.flush()  # the runner flushes periodically: finished spans go now, the open root later
        assert [span.name for span in await store.query_spans(ctx.rollout_id)] == ["reward", "grep", "helper", "reward"]
    spans = await store.query_spans(claim.rollout.rollout_id)
    assert [(s.sequence_id, s.kind, s.name) for s in spans] == [
        (1, SpanKind.AGENT, "main"),
        (2, SpanKind.REWARD, "reward"),
        (3, SpanKind.TOOL, "grep"),
        (4, SpanKind.AGENT, "helper"),
        (5, SpanKind.REWARD, "reward"),
    ]
    root, reward, tool, helper, inner = spans
    assert reward.attributes == {
        semconv.REWARD_VALUE: 0.25,
        semconv.REWARD_NAME: "thread",
        semconv.REWARD_SOURCE: "agent",
        semconv.AGENT_NAME: "main",
    }
    assert tool.attributes[semconv.TOOL_EXIT_STATUS] == 1 and tool.attributes[semconv.TOOL_OUTPUT] == "found"
    assert tool.parent_id == root.span_id and helper.parent_id == root.span_id
    assert inner.parent_id == helper.span_id and inner.attributes[semconv.AGENT_NAME] == "helper"
    assert root.status is SpanStatus.OK and root.end_time is not None
    assert current_attempt() is None


@pytest.mark.anyio
async def test_a_failing_agent_still_flushes_and_marks_its_span(tracer: Tracer) -> None:
    store = MemoryStore()
    claim = await new_claim(store)
    with pytest.raises(RuntimeError):
        async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="main"):
            try:
                with agent_scope("inner"):
                    raise KeyError("missing")
            except KeyError as err:
                emit_exception(err)
            raise RuntimeError("agent\nfailed")
    root, inner, exception = await store.query_spans(claim.rollout.rollout_id)
    assert root.status is SpanStatus.ERROR and root.status_message == "RuntimeError: agent failed"
    assert inner.status is SpanStatus.ERROR and inner.status_message == "KeyError: 'missing'"
    assert exception.kind is SpanKind.OTHER and exception.name == "exception"
    assert exception.attributes[semconv.EXCEPTION_TYPE] == "KeyError"
    assert "raise KeyError" in exception.attributes[semconv.EXCEPTION_STACKTRACE]
    assert exception.parent_id == root.span_id  # the scope had closed when it was recorded


@pytest.mark.anyio
async def test_a_thread_left_running_does_not_write_into_a_finished_attempt() -> None:
    store = MemoryStore()
    claim = await new_claim(store)
    tracer = make_tracer("light")
    go, done = threading.Event(), threading.Event()

    def straggler() -> None:
        go.wait(5)
        emit_reward(9.0)
        done.set()

    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="main") as ctx:
        task = asyncio.create_task(asyncio.to_thread(straggler))
    go.set()
    await task
    assert done.is_set() and ctx.rewards == []
    assert [span.name for span in await store.query_spans(claim.rollout.rollout_id)] == ["main"]


@pytest.mark.anyio
async def test_emit_tool_takes_the_call_id_of_the_model_call_it_answers() -> None:
    store = MemoryStore()
    claim = await new_claim(store)
    async with make_tracer("light").attempt(store, claim.rollout, claim.attempt, agent_name="main") as ctx:
        ctx.pending_tool_calls["call_9"] = ("search", '{"q": "x"}')
        emit_tool("search", {"q": "x"}, "result")
        assert ctx.pending_tool_calls == {}
    tool = (await store.query_spans(claim.rollout.rollout_id))[1]
    assert tool.attributes[semconv.TOOL_CALL_ID] == "call_9"


def test_make_tracer_refuses_unknown_kinds() -> None:
    from alight.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown tracer 'jaeger'"):
        make_tracer("jaeger")
