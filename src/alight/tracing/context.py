"""The attempt context: which attempt the running code belongs to, and how it records spans.

A tracer's `attempt(...)` puts an `AttemptContext` in a context variable for the run of one agent.
Everything that records spans (the emit_* functions, the openai/LangChain/Agents SDK
instrumentation) finds it there, so it works from any thread or task that inherited the context
(sync agents run in `asyncio.to_thread`). The context owns the attempt's sequence counter and a
buffer of finished spans that `flush()` writes to the store. Tracers differ only in how an open
span becomes a `Span` record (`_open`/`_close`).
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import json
import logging
import math
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from alight import semconv
from alight.errors import one_line
from alight.store.base import Store
from alight.types import Span, SpanKind, SpanStatus

logger = logging.getLogger(__name__)


class ActiveSpan:
    """A span being recorded; `end()` turns it into a `Span` in the attempt's buffer."""

    __slots__ = (
        "attempt",
        "attributes",
        "kind",
        "name",
        "native",
        "parent",
        "sequence_id",
        "span_id",
        "start_time",
        "trace_id",
    )

    def __init__(
        self,
        attempt: AttemptContext,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        parent: ActiveSpan | None,
        sequence_id: int,
        start_time: float,
    ) -> None:
        self.attempt = attempt
        self.name = name
        self.kind = kind
        self.attributes = attributes
        self.parent = parent
        self.sequence_id = sequence_id
        self.start_time = start_time
        self.span_id = ""
        self.trace_id = ""
        self.native: Any = None  # the tracer's own span object, if it has one

    def end(
        self, status: SpanStatus = SpanStatus.OK, message: str | None = None, end_time: float | None = None
    ) -> None:
        """Finish the span with `status` (and a one-line `message` for errors)."""
        self.attempt._close(self, status, message, time.time() if end_time is None else end_time)


class _Frame:
    """What the current code runs under: an attempt, the agent making calls, the parent span.

    A frame is closed when its scope ends. Frameworks may leave a closed frame behind in a
    context (callbacks that start and end a scope in different contexts): lookups then fall
    back to the nearest open outer frame."""

    __slots__ = ("agent_name", "attempt", "closed", "outer", "parent")

    def __init__(
        self, attempt: AttemptContext, agent_name: str, parent: ActiveSpan | None, outer: _Frame | None = None
    ) -> None:
        self.attempt = attempt
        self.agent_name = agent_name
        self.parent = parent
        self.outer = outer
        self.closed = False


_CURRENT: ContextVar[_Frame | None] = ContextVar("alight_attempt", default=None)
_warned: set[str] = set()


class AttemptContext(abc.ABC):
    """One attempt's tracing state: ids, sequence counter, span buffer, rewards."""

    def __init__(self, store: Store, rollout_id: str, attempt_id: str, agent_name: str) -> None:
        self.store = store
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.agent_name = agent_name
        self.rewards: list[float] = []
        self._counter = itertools.count(1)
        self._finished: deque[Span] = deque()  # append/popleft are thread-safe
        # Tool calls answered by the model and not yet seen run, by call id: (name, arguments).
        self.pending_tool_calls: dict[str, tuple[str, Any]] = {}
        #: False when the agent's model calls reach the proxy without this attempt's sequence numbers
        #: (the runner does not instrument): the proxy's spans are then numbered by the store as they
        #: arrive, so this attempt's own spans are written unnumbered too, numbered after them, never
        #: reusing a number the store gave a model call.
        self.numbered = True

    @property
    def last_reward(self) -> float | None:
        """The last reward emitted in this attempt, or None."""
        return self.rewards[-1] if self.rewards else None

    def next_sequence_id(self) -> int:
        """The next number of the attempt's span order (thread-safe)."""
        return next(self._counter)

    # -- recording ------------------------------------------------------------------------
    def start_span(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any] | None = None,
        *,
        frame: _Frame | None = None,
        sequence_id: int | None = None,
        start_time: float | None = None,
    ) -> ActiveSpan:
        """Open a span under the current frame's parent, attributed to its agent."""
        frame = frame or current_frame()
        attrs = attributes if attributes is not None else {}
        parent = None
        if frame is not None and frame.attempt is self:
            parent = frame.parent
            attrs.setdefault(semconv.AGENT_NAME, frame.agent_name)
        else:
            attrs.setdefault(semconv.AGENT_NAME, self.agent_name)
        span = ActiveSpan(
            self,
            name,
            kind,
            attrs,
            parent,
            self.next_sequence_id() if sequence_id is None else sequence_id,
            time.time() if start_time is None else start_time,
        )
        self._open(span)
        return span

    def record(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any] | None = None,
        *,
        status: SpanStatus = SpanStatus.OK,
        message: str | None = None,
        frame: _Frame | None = None,
        sequence_id: int | None = None,
    ) -> ActiveSpan:
        """Record a span that starts and ends now."""
        span = self.start_span(name, kind, attributes, frame=frame, sequence_id=sequence_id)
        span.end(status, message, span.start_time)
        return span

    def claim_tool_call(self, name: str, arguments: Any = None, call_id: str | None = None) -> str | None:
        """A tool run was recorded: forget the pending model tool call it answers (by id, else by
        name). Returns that call's id, so frameworks that do not pass one still get it."""
        if call_id is not None:
            self.pending_tool_calls.pop(call_id, None)
            return call_id
        for pending_id, (pending_name, _) in list(self.pending_tool_calls.items()):
            if pending_name == name:
                self.pending_tool_calls.pop(pending_id, None)
                return pending_id
        return None

    def take_finished(self) -> list[Span]:
        """Remove and return every finished span not yet written."""
        taken: list[Span] = []
        while self._finished:
            taken.append(self._finished.popleft())
        return taken

    async def flush(self) -> None:
        """Write the finished spans to the store."""
        spans = self.take_finished()
        if spans:
            written = spans if self.numbered else [s.model_copy(update={"sequence_id": None}) for s in spans]
            try:
                await self.store.add_spans(written)
            except BaseException:
                self._finished.extendleft(reversed(spans))  # keep them for the next flush
                raise

    # -- tracer specific ------------------------------------------------------------------
    @abc.abstractmethod
    def _open(self, span: ActiveSpan) -> None:
        """Start the tracer's span; must set `span.span_id` and `span.trace_id`."""

    @abc.abstractmethod
    def _close(self, span: ActiveSpan, status: SpanStatus, message: str | None, end_time: float) -> None:
        """End the tracer's span; the resulting `Span` lands in `self._finished`."""

    # -- scopes ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def activate(self, agent_name: str, parent: ActiveSpan | None) -> Iterator[_Frame]:
        """Make this attempt current (for the code inside), with `agent_name` making the calls."""
        frame = _Frame(self, agent_name, parent)
        token = _CURRENT.set(frame)
        try:
            yield frame
        finally:
            frame.closed = True  # threads the agent left running no longer record into this attempt
            _CURRENT.reset(token)


def current_frame() -> _Frame | None:
    """The attempt, agent and parent span the running code is under, or None outside an attempt."""
    frame = _CURRENT.get()
    while frame is not None and frame.closed:
        frame = frame.outer
    return frame


def current_attempt() -> AttemptContext | None:
    """The attempt the running code belongs to, or None outside an attempt."""
    frame = current_frame()
    return None if frame is None else frame.attempt


def set_frame(frame: _Frame | None) -> None:
    """Make `frame` current in this context (for instrumentation that cannot use a `with`)."""
    _CURRENT.set(frame)


def enter_agent(name: str, attributes: dict[str, Any] | None = None) -> _Frame | None:
    """Open an AGENT span named `name` and make `name` the agent of the calls that follow.

    Returns the new frame (its `parent` is the span, its `outer` the frame it replaced) for
    `exit_agent`; None outside an attempt."""
    outer = current_frame()
    if outer is None:
        return None
    attrs = dict(attributes or {})
    attrs[semconv.AGENT_NAME] = name
    span = outer.attempt.start_span(name, SpanKind.AGENT, attrs, frame=outer)
    frame = _Frame(outer.attempt, name, span, outer)
    _CURRENT.set(frame)
    return frame


def exit_agent(frame: _Frame | None, error: BaseException | str | None = None) -> None:
    """Close an agent scope opened by `enter_agent`: end its span, restore the outer frame."""
    if frame is None or frame.closed:
        return
    frame.closed = True
    if frame.parent is not None:
        if error is None:
            frame.parent.end()
        else:
            frame.parent.end(SpanStatus.ERROR, one_line(error))
    _CURRENT.set(frame.outer)


@contextlib.contextmanager
def agent_scope(name: str) -> Iterator[None]:
    """Spans made inside are attributed to agent `name`, under an AGENT span of that name."""
    frame = enter_agent(name)
    try:
        yield
    except BaseException as err:
        exit_agent(frame, err)
        raise
    exit_agent(frame)


# -- what agent code calls ---------------------------------------------------------------------


def _frame_or_warn(what: str) -> _Frame | None:
    frame = current_frame()
    if frame is None and what not in _warned:
        _warned.add(what)
        logger.warning("alight.%s called outside a rollout: ignored (this warning is shown once)", what)
    return frame


def emit_reward(value: float, name: str | None = None) -> None:
    """Record a reward for the current rollout (the last one emitted is the rollout's reward
    unless the agent returns one)."""
    frame = _frame_or_warn("emit_reward")
    if frame is None:
        return
    reward = float(value)
    if not math.isfinite(reward):  # the store refuses it, and it would poison every advantage of the group
        raise ValueError(f"a reward must be a finite number, got {value!r}")
    attrs: dict[str, Any] = {semconv.REWARD_VALUE: reward, semconv.REWARD_SOURCE: "agent"}
    if name is not None:
        attrs[semconv.REWARD_NAME] = name
    frame.attempt.rewards.append(reward)
    frame.attempt.record("reward", SpanKind.REWARD, attrs, frame=frame)


def emit_tool(
    name: str,
    arguments: Any = None,
    output: Any = None,
    *,
    error: bool = False,
    exit_status: int | None = None,
    sql: str | None = None,
    call_id: str | None = None,
) -> None:
    """Record a tool call the agent made (name, arguments, output, whether it failed)."""
    frame = _frame_or_warn("emit_tool")
    if frame is None:
        return
    call_id = frame.attempt.claim_tool_call(name, arguments, call_id)
    attrs = tool_attributes(name, arguments, output, error=error, call_id=call_id)
    if exit_status is not None:
        attrs[semconv.TOOL_EXIT_STATUS] = int(exit_status)
    if sql is not None:
        attrs[semconv.TOOL_SQL] = sql
    frame.attempt.record(name, SpanKind.TOOL, attrs, status=SpanStatus.ERROR if error else SpanStatus.OK, frame=frame)


def emit_exception(exc: BaseException) -> None:
    """Record an exception (type, message, stack trace) in the current rollout."""
    frame = _frame_or_warn("emit_exception")
    if frame is None:
        return
    attrs = {
        semconv.EXCEPTION_TYPE: type(exc).__name__,
        semconv.EXCEPTION_MESSAGE: str(exc),
        semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
    }
    status = SpanStatus.ERROR
    frame.attempt.record("exception", SpanKind.OTHER, attrs, status=status, message=one_line(exc), frame=frame)


def tool_attributes(
    name: str, arguments: Any, output: Any, *, error: bool = False, call_id: str | None = None
) -> dict[str, Any]:
    """The attributes of a TOOL span (values made JSON-safe)."""
    attrs: dict[str, Any] = {semconv.TOOL_NAME: name, semconv.TOOL_ERROR: bool(error)}
    if call_id is not None:
        attrs[semconv.TOOL_CALL_ID] = call_id
    if arguments is not None:
        attrs[semconv.TOOL_ARGUMENTS] = jsonable(arguments)
    if output is not None:
        attrs[semconv.TOOL_OUTPUT] = jsonable(output)
    return attrs


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data: pydantic models dumped, unknown objects as their str()."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json", exclude_none=True))
        except Exception:  # a model that cannot dump itself is recorded as text
            return str(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
