"""AutoGen AgentChat instrumentation: agent runs as AGENT spans, tool runs as TOOL spans.

AutoGen marks every agent invocation with its own telemetry context manager,
`autogen_core.trace_invoke_agent_span` (an agent's `run`/`run_stream`, and a team's turn of one
agent). Inside an attempt, the wrapped manager also runs the invocation under an AGENT span named
after the agent, so the LLM calls it makes are attributed to it (the openai instrumentation or the
proxy records them: AutoGen's OpenAI clients use the `openai` SDK). Each `BaseTool.run_json` (how
AutoGen's workbench runs a FunctionTool or a plain function) records a TOOL span with the tool's
name, arguments, output and the model's call id. Outside an attempt both do only AutoGen's work.

AgentChat's modules import the manager by name (`from autogen_core import ...`), so it is replaced
in `autogen_core` right after its import (before AgentChat binds it), and in any module that bound
it already. (This module imports autogen_core: `alight.tracing` loads it only when asked.)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import autogen_core
from autogen_core.tools import BaseTool

from alight.errors import one_line
from alight.tracing.context import current_frame, enter_agent, exit_agent, tool_attributes
from alight.types import SpanKind, SpanStatus

logger = logging.getLogger(__name__)

_installed = False


def _traced_invoke(original: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.contextmanager
    @functools.wraps(original)
    def invoke_agent_span(agent_name: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(agent_name, *args, **kwargs) as span:
            frame = enter_agent(agent_name)
            try:
                yield span
            except GeneratorExit:  # a run_stream its caller stopped reading: not an error of the agent
                exit_agent(frame)
                raise
            except BaseException as err:
                exit_agent(frame, err)
                raise
            exit_agent(frame)

    return invoke_agent_span


def _traced_run_json(run_json: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_json)
    async def traced(
        self: BaseTool[Any, Any], args: Mapping[str, Any], cancellation_token: Any, call_id: str | None = None
    ) -> Any:
        frame = current_frame()
        if frame is None:
            return await run_json(self, args, cancellation_token, call_id=call_id)
        arguments = dict(args)
        call_id = frame.attempt.claim_tool_call(self.name, arguments, call_id) or call_id
        active = frame.attempt.start_span(
            self.name, SpanKind.TOOL, tool_attributes(self.name, arguments, None, call_id=call_id), frame=frame
        )
        try:
            value = await run_json(self, args, cancellation_token, call_id=call_id)
        except BaseException as err:
            active.attributes.update(tool_attributes(self.name, arguments, f"{type(err).__name__}: {err}", error=True))
            active.end(SpanStatus.ERROR, one_line(err))
            raise
        active.attributes.update(tool_attributes(self.name, arguments, self.return_value_as_string(value)))
        active.end()
        return value

    return traced


def instrument_autogen() -> bool:
    """Wrap AutoGen's invoke-agent span and `BaseTool.run_json` (once per process)."""
    global _installed
    if _installed:
        return True
    original = autogen_core.trace_invoke_agent_span
    traced = _traced_invoke(original)
    autogen_core.trace_invoke_agent_span = traced
    for name, module in list(sys.modules.items()):  # AutoGen modules imported before alight instrumented
        if name.startswith("autogen") and getattr(module, "trace_invoke_agent_span", None) is original:
            module.trace_invoke_agent_span = traced  # type: ignore[attr-defined]
    BaseTool.run_json = _traced_run_json(BaseTool.run_json)  # type: ignore[method-assign]
    _installed = True
    return True
