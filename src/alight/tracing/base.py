"""The `Tracer` interface: one attempt's tracing from the runner's point of view.

`tracer.attempt(store, rollout, attempt, agent_name=...)` wraps one run of the agent: it opens an
AGENT span for the run, makes the attempt current for the code inside (see `context`), and writes
every finished span to the store when it exits. `instrument()` hooks the libraries agents use
(openai, LangChain/LangGraph, the OpenAI Agents SDK, AutoGen) once per process, so agent code
needs no alight call to be traced.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from alight import semconv
from alight.errors import one_line
from alight.store.base import Store
from alight.tracing.context import AttemptContext
from alight.types import Attempt, Rollout, SpanKind, SpanStatus

logger = logging.getLogger(__name__)


class Tracer(abc.ABC):
    """Records the spans of attempts into a store; subclasses choose how spans are made."""

    def instrument(self) -> None:
        """Hook openai, LangChain/LangGraph, the OpenAI Agents SDK, AutoGen and the HTTP clients
        (httpx, requests, aiohttp, urllib; those installed).
        Idempotent, once per process; the hooks act only inside an attempt."""
        from alight.tracing.instrument import instrument_all

        instrument_all()

    @abc.abstractmethod
    def _new_attempt(self, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> AttemptContext:
        """The tracer's attempt context."""

    def _end_attempt(self, ctx: AttemptContext) -> None:  # noqa: B027 - optional hook
        """Called once the attempt's spans are flushed."""

    @contextlib.asynccontextmanager
    async def attempt(
        self, store: Store, rollout: Rollout, attempt: Attempt, *, agent_name: str
    ) -> AsyncIterator[AttemptContext]:
        """Trace one run of the agent: an AGENT span around it, every span flushed on exit."""
        ctx = self._new_attempt(store, rollout.rollout_id, attempt.attempt_id, agent_name)
        root = ctx.start_span(agent_name, SpanKind.AGENT, {semconv.AGENT_NAME: agent_name}, frame=None)
        try:
            with ctx.activate(agent_name, root):
                try:
                    yield ctx
                except BaseException as err:
                    root.end(SpanStatus.ERROR, one_line(err))
                    raise
                root.end()
        finally:
            try:
                await ctx.flush()
            finally:
                self._end_attempt(ctx)

    def langchain_handler(self) -> Any:
        """The process's LangChain callback handler (agent/node and tool spans), for
        `config={"callbacks": [...]}` where automatic registration does not reach; being the
        registered handler itself, passing it too records nothing twice."""
        from alight.tracing.langchain import shared_handler

        return shared_handler()
