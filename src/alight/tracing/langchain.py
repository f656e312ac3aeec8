"""LangChain/LangGraph instrumentation: a callback handler for agent (node) and tool spans.

Inside an attempt, each LangGraph node runs under an AGENT span named after the node, and the
LLM calls it makes are attributed to it (the openai instrumentation or the proxy records them);
tools record TOOL spans. A tool's SQL (a string argument named `sql`, or `query` of a tool whose
name says sql, such as LangChain's `sql_db_query`) is recorded as `tool.sql` for AIR rules.
`instrument_langchain()` registers the handler through LangChain's configure hook, so every runnable
invoked inside an attempt uses it without being passed it.
(This module imports langchain_core: `alight.tracing` loads it only when asked.)
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from alight import semconv
from alight.errors import one_line
from alight.tracing.context import (
    ActiveSpan,
    _Frame,
    current_frame,
    enter_agent,
    exit_agent,
    jsonable,
    set_frame,
    tool_attributes,
)
from alight.types import SpanKind, SpanStatus

logger = logging.getLogger(__name__)

_installed = False


class AlightCallbackHandler(BaseCallbackHandler):
    """Records LangGraph nodes as AGENT spans and tool runs as TOOL spans; does nothing outside
    an attempt. Runs inline so that the agent it sets is seen by the LLM call that follows.

    LangChain may end a run in another context than it started it in, so which agent and parent
    span a run belongs to is followed along the run tree (`parent_run_id`), not read from the
    context: every chain run inherits its parent's frame, a node run opens a new one."""

    run_inline = True
    raise_error = False

    def __init__(self) -> None:
        self._frames: dict[UUID, _Frame] = {}  # chain run -> the frame its children run under
        self._roots: dict[UUID, _Frame] = {}  # top-level run -> the frame to restore when it ends
        self._agents: dict[UUID, _Frame] = {}
        self._llms: dict[UUID, _Frame] = {}
        self._tools: dict[UUID, ActiveSpan] = {}

    def _frame_of(self, parent_run_id: UUID | None) -> _Frame | None:
        frame = self._frames.get(parent_run_id) if parent_run_id is not None else None
        return frame if frame is not None else current_frame()

    # -- chains and graph nodes ---------------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parent = self._frames.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            parent = current_frame()
            if parent is None:
                return
            self._roots[run_id] = parent
        node = (metadata or {}).get("langgraph_node")
        name = kwargs.get("name") or (serialized or {}).get("name")
        if isinstance(node, str) and node == name and not node.startswith("__"):
            set_frame(parent)
            frame = enter_agent(node)  # the node's frame, for the code that follows
            if frame is None:
                return
            self._agents[run_id] = self._frames[run_id] = frame
        else:
            self._frames[run_id] = parent

    def _chain_end(self, run_id: UUID, error: BaseException | None) -> None:
        self._frames.pop(run_id, None)
        exit_agent(self._agents.pop(run_id, None), error)
        root = self._roots.pop(run_id, None)
        if root is not None:
            set_frame(root)  # the agent's code after the graph runs under its own frame again

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._chain_end(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._chain_end(run_id, error)

    # -- LLM calls: attributed to the node they run in ----------------------------------------
    def _llm_start(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        frame = self._frames.get(parent_run_id) if parent_run_id is not None else None
        current = current_frame()
        if frame is None or current is None or frame is current:
            return
        self._llms[run_id] = current
        set_frame(frame)

    def _llm_end(self, run_id: UUID) -> None:
        previous = self._llms.pop(run_id, None)
        if previous is not None:
            set_frame(previous)

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._llm_start(run_id, parent_run_id)

    def on_llm_start(
        self, serialized: Any, prompts: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._llm_start(run_id, parent_run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._llm_end(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._llm_end(run_id)

    # -- tools ------------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        frame = self._frame_of(parent_run_id)
        if frame is None:
            return
        name = str(kwargs.get("name") or (serialized or {}).get("name") or "tool")
        arguments = inputs if inputs is not None else input_str
        call_id = frame.attempt.claim_tool_call(name, arguments, kwargs.get("tool_call_id"))
        attrs = tool_attributes(name, arguments, None, call_id=call_id)
        sql = sql_argument(name, arguments)
        if sql is not None:
            attrs[semconv.TOOL_SQL] = sql
        self._tools[run_id] = frame.attempt.start_span(name, SpanKind.TOOL, attrs, frame=frame)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        span = self._tools.pop(run_id, None)
        if span is None:
            return
        content = getattr(output, "content", output)  # a ToolMessage, or the tool's own value
        if content is not None:
            span.attributes[semconv.TOOL_OUTPUT] = jsonable(content)
        if getattr(output, "status", None) == "error":
            span.attributes[semconv.TOOL_ERROR] = True
            span.end(SpanStatus.ERROR, str(content)[:1000])
        else:
            span.end()

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        span = self._tools.pop(run_id, None)
        if span is None:
            return
        span.attributes[semconv.TOOL_ERROR] = True
        span.attributes[semconv.TOOL_OUTPUT] = f"{type(error).__name__}: {error}"
        span.end(SpanStatus.ERROR, one_line(error))


def sql_argument(tool_name: str, arguments: Any) -> str | None:
    """The SQL a tool call runs: its string argument `sql`, or for a tool named like `*sql*` its
    argument `query` (or its whole input when that is a string); None for any other tool."""
    names_sql = "sql" in tool_name.lower()
    if isinstance(arguments, dict):
        value = arguments.get("sql", arguments.get("query") if names_sql else None)
        return value if isinstance(value, str) and value.strip() else None
    if names_sql and isinstance(arguments, str) and arguments.strip():
        return arguments
    return None


_shared: AlightCallbackHandler | None = None


def shared_handler() -> AlightCallbackHandler:
    """The process's handler (one instance, so passing it explicitly does not record twice)."""
    global _shared
    if _shared is None:
        _shared = AlightCallbackHandler()
    return _shared


def instrument_langchain() -> bool:
    """Make LangChain use the handler for every run inside an attempt; False without langchain."""
    global _installed
    if _installed:
        return True
    from langchain_core.tracers.context import register_configure_hook

    # The variable's default is the handler, so every run in every context gets it (also in an
    # attempt that began before LangChain was first imported); outside attempts it does nothing.
    handler = shared_handler()  # one process-wide object, shared on purpose
    always: ContextVar[BaseCallbackHandler | None] = ContextVar("alight_langchain_handler", default=handler)
    register_configure_hook(always, inheritable=True)
    _installed = True
    return True
