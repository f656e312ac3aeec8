"""CrewAI instrumentation: an agent's work as an AGENT span named by its role, tool runs as TOOL spans.

Inside an attempt, each `crewai.Agent` execution (a crew's task: `execute_task`/`aexecute_task`; a
standalone agent: `kickoff`/`kickoff_async`) runs under an AGENT span named after the agent's `role`,
the one name every CrewAI agent has, so the LLM calls it makes are attributed to it: CrewAI's native
OpenAI provider calls models with the `openai` SDK (whose instrumentation adds the proxy headers),
other providers go through LiteLLM. The span is opened in the agent's own thread and context, which
CrewAI carries into its worker threads; its event bus could not do this (handlers run later, on
other threads). A failed execution CrewAI retries (it calls the agent again from inside the failed
call) ends with its error, and the retry gets its own span beside it. Each tool run is a TOOL
span with the tool's name, arguments and result, recorded by a global
`before_tool_call`/`after_tool_call` hook pair (CrewAI's public tool hooks, called synchronously
around every tool run, native tool calls and ReAct alike). Outside an attempt both do only
CrewAI's work.

CrewAI's own telemetry and its trace upload are turned off (`CREWAI_DISABLE_TELEMETRY=true`,
`CREWAI_TRACING_ENABLED=false`, unless already set) so nothing tries the network: set
ALIGHT_CREWAI_TELEMETRY=1 to leave them alone. `OTEL_SDK_DISABLED` is not used: it would turn off
alight's own OpenTelemetry tracer too. (This module imports crewai: `alight.tracing` loads it only
when asked. `crewai.hooks.clear_all_global_hooks()` removes the tool hooks with the user's.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

from crewai import Agent
from crewai.hooks import ToolCallHookContext, register_after_tool_call_hook, register_before_tool_call_hook

from alight import semconv
from alight.errors import one_line
from alight.tracing.context import ActiveSpan, _Frame, current_frame, enter_agent, exit_agent, tool_attributes
from alight.types import SpanKind, SpanStatus

logger = logging.getLogger(__name__)

#: Set to 1 to keep CrewAI's own telemetry and trace upload as CrewAI configures them.
KEEP_TELEMETRY_ENV = "ALIGHT_CREWAI_TELEMETRY"
#: What alight sets (when unset) so that CrewAI sends nothing anywhere.
QUIET_ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}
#: How CrewAI reports a tool that raised (the result the model reads; no exception reaches the hook).
TOOL_ERROR_PREFIX = "Error executing tool"

# The tool spans open in this context, innermost last (a tuple: contexts CrewAI copies for parallel
# tool calls must not share one mutable stack).
_open_tools: ContextVar[tuple[ActiveSpan, ...]] = ContextVar("alight_crewai_tools", default=())
# The innermost agent execution running in this context, and its frame (to tell CrewAI's retry).
_running: ContextVar[tuple[Any, _Frame | None] | None] = ContextVar("alight_crewai_running", default=None)
_installed = False


def agent_name(agent: Any) -> str:
    """The name of a CrewAI agent's spans: its role (stripped), or its class name without one."""
    role = getattr(agent, "role", None)
    return role.strip() if isinstance(role, str) and role.strip() else type(agent).__name__


def _enter(agent: Any) -> tuple[_Frame | None, Token[tuple[Any, _Frame | None] | None]]:
    """Open `agent`'s AGENT span. CrewAI retries a failed execution by calling it again from its
    `except` block, inside the first call: that first execution's span is ended with its error
    here, so the retry's span opens beside it (under the same parent), not inside it."""
    running = _running.get()
    failed = sys.exc_info()[1]
    if running is not None and running[0] is agent and running[1] is current_frame() and failed is not None:
        exit_agent(running[1], failed)
    frame = enter_agent(agent_name(agent))
    return frame, _running.set((agent, frame))


def _traced_sync(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current_frame() is None:
            return method(self, *args, **kwargs)
        frame, token = _enter(self)
        try:
            result = method(self, *args, **kwargs)
        except BaseException as err:
            exit_agent(frame, err)  # nothing if a retry already ended it
            raise
        finally:
            _running.reset(token)
        exit_agent(frame)
        return result

    return traced


def _traced_async(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current_frame() is None:
            return await method(self, *args, **kwargs)
        frame, token = _enter(self)
        try:
            result = await method(self, *args, **kwargs)
        except BaseException as err:
            exit_agent(frame, err)  # nothing if a retry already ended it
            raise
        finally:
            _running.reset(token)
        exit_agent(frame)
        return result

    return traced


def _traced_kickoff(kickoff: Callable[..., Any]) -> Callable[..., Any]:
    traced = _traced_sync(kickoff)

    @functools.wraps(kickoff)
    def kickoff_in_scope(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return traced(self, *args, **kwargs)
        # Inside an event loop CrewAI hands back `kickoff_async(...)`, whose own wrapper opens the span.
        return kickoff(self, *args, **kwargs)

    return kickoff_in_scope


def before_tool_call(context: ToolCallHookContext) -> None:
    """Open a TOOL span for the tool CrewAI is about to run (never blocks the call)."""
    frame = current_frame()
    if frame is None:
        return None
    name = context.tool_name
    arguments = dict(context.tool_input or {})
    call_id = frame.attempt.claim_tool_call(name, arguments)
    span = frame.attempt.start_span(name, SpanKind.TOOL, tool_attributes(name, arguments, None, call_id=call_id))
    _open_tools.set((*_open_tools.get(), span))
    return None


def after_tool_call(context: ToolCallHookContext) -> None:
    """Close the tool's span with its result (never changes the result)."""
    opened = _open_tools.get()
    index = next((i for i in range(len(opened) - 1, -1, -1) if opened[i].name == context.tool_name), None)
    if index is None:
        return None
    span = opened[index]
    _open_tools.set(opened[:index] + opened[index + 1 :])
    output = context.tool_result
    error = context.raw_tool_result is output and isinstance(output, str) and output.startswith(TOOL_ERROR_PREFIX)
    span.attributes.update(
        tool_attributes(
            context.tool_name,
            span.attributes.get(semconv.TOOL_ARGUMENTS),
            output,
            error=error,
            call_id=span.attributes.get(semconv.TOOL_CALL_ID),
        )
    )
    if error:
        span.end(SpanStatus.ERROR, one_line(str(output)))
    else:
        span.end()
    return None


def quiet_crewai_telemetry() -> None:
    """Turn CrewAI's telemetry and trace upload off where the user has not decided (see module doc)."""
    if os.environ.get(KEEP_TELEMETRY_ENV) == "1":
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)


def instrument_crewai() -> bool:
    """Wrap `crewai.Agent`'s executions and register the tool hooks (once per process)."""
    global _installed
    if _installed:
        return True
    quiet_crewai_telemetry()
    for name in ("execute_task",):
        setattr(Agent, name, _traced_sync(getattr(Agent, name)))
    for name in ("aexecute_task", "kickoff_async"):
        setattr(Agent, name, _traced_async(getattr(Agent, name)))
    Agent.kickoff = _traced_kickoff(Agent.kickoff)  # type: ignore[method-assign]
    register_before_tool_call_hook(before_tool_call)
    register_after_tool_call_hook(after_tool_call)
    _installed = True
    return True
