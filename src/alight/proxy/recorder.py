"""LLM spans of proxied calls: which attempt a call belongs to, the span itself, and its write.

Spans are written in the background once the answer is complete, so the store's latency never
adds to the call's; `SpanRecorder.flush` returns once every span of a finished call is stored (the
trainer calls it before reading a batch's spans, the proxy on shutdown). A span the store refuses
(an unknown rollout or attempt) is logged; the client has its answer already. The recorded request
messages are the ones the engine saw: text parts joined into one string, `developer` as `system`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from alight import semconv
from alight.engines.base import ChatRequest, CompletionRequest, Generation
from alight.store.base import Store
from alight.types import Span, SpanKind, SpanStatus, new_span_id, new_trace_id

logger = logging.getLogger(__name__)


@dataclass
class CallContext:
    """Where a call comes from: its attempt (from the URL path or headers) and tracing links."""

    rollout_id: str | None = None
    attempt_id: str | None = None
    agent_name: str | None = None
    parent_id: str | None = None
    trace_id: str | None = None
    sequence_id: int | None = None
    span_id: str = field(default_factory=new_span_id)

    @property
    def recorded(self) -> bool:
        return self.rollout_id is not None and self.attempt_id is not None

    @property
    def recorded_span_id(self) -> str | None:
        """The id of the call's span, None when the call is not recorded."""
        return self.span_id if self.recorded else None

    @classmethod
    def of(cls, path_params: Mapping[str, str], headers: Mapping[str, str]) -> CallContext:
        """Ids from the path (`/rollout/{rollout_id}/attempt/{attempt_id}[/agent/{agent_name}/trace/
        {trace_id}/span/{parent_span_id}]/v1/...`), else the headers. Without a sequence id the
        store numbers the span as it arrives (after every span of the attempt stored so far)."""
        sequence = headers.get(semconv.HEADER_SEQUENCE_ID)
        sequence_id = None
        if sequence is not None:
            try:
                sequence_id = int(sequence)
            except ValueError:
                logger.warning("proxy: ignoring a non-integer %s header %r", semconv.HEADER_SEQUENCE_ID, sequence)
        return cls(
            rollout_id=path_params.get("rollout_id") or headers.get(semconv.HEADER_ROLLOUT_ID),
            attempt_id=path_params.get("attempt_id") or headers.get(semconv.HEADER_ATTEMPT_ID),
            agent_name=path_params.get("agent_name") or headers.get(semconv.HEADER_AGENT_NAME),
            parent_id=path_params.get("parent_span_id") or headers.get(semconv.HEADER_PARENT_SPAN_ID),
            trace_id=path_params.get("trace_id") or headers.get(semconv.HEADER_TRACE_ID),
            sequence_id=sequence_id,
        )


def sampling_attribute(request: ChatRequest | CompletionRequest) -> dict[str, Any]:
    """The request's sampling settings as recorded: OpenAI names, provider extras included."""
    sampling = dataclasses.asdict(request.sampling)
    sampling.pop("logprobs", None)
    if isinstance(request, ChatRequest):
        if request.tool_choice is not None:
            sampling["tool_choice"] = request.tool_choice
        if request.response_format is not None:
            sampling["response_format"] = request.response_format
    sampling.update(request.extra)
    return sampling


def llm_span(
    context: CallContext,
    request: ChatRequest | CompletionRequest,
    *,
    stream: bool,
    started: float,
    latency_s: float,
    version: int | None,
    generation: Generation | None,
    message: dict[str, Any] | None = None,
    error: str | None = None,
    api: str | None = None,
) -> Span:
    """The one LLM span of a call (`context.recorded` must be true). `message` is the assistant
    message as answered; `error` marks a call that failed after reaching the engine; `api` is the
    OpenAI API the client called (default: "chat" for a chat request, else "completions"). A
    Responses API call is recorded as the chat request it was translated into."""
    assert context.rollout_id is not None and context.attempt_id is not None
    chat = isinstance(request, ChatRequest)
    attributes: dict[str, Any] = {
        semconv.LLM_SOURCE: "proxy",
        semconv.LLM_API: api or ("chat" if chat else "completions"),
        semconv.LLM_REQUEST_MODEL: request.model,
        semconv.LLM_REQUEST_SAMPLING: sampling_attribute(request),
        semconv.LLM_STREAM: stream,
        semconv.LLM_LATENCY_S: latency_s,
        semconv.RESOURCES_VERSION: version,
    }
    if isinstance(request, ChatRequest):
        attributes[semconv.LLM_REQUEST_MESSAGES] = request.messages
        if request.tools:
            attributes[semconv.LLM_REQUEST_TOOLS] = request.tools
    else:
        attributes[semconv.LLM_REQUEST_PROMPT] = request.prompt
    if context.agent_name is not None:
        attributes[semconv.AGENT_NAME] = context.agent_name
    if generation is not None:
        if chat:
            attributes[semconv.LLM_RESPONSE_MESSAGE] = message if message is not None else generation.message
        else:
            attributes[semconv.LLM_RESPONSE_TEXT] = generation.text
        attributes[semconv.LLM_FINISH_REASON] = generation.finish_reason
        attributes[semconv.LLM_RESPONSE_MODEL] = generation.model
        if generation.adapter is not None:
            attributes[semconv.LLM_ADAPTER] = generation.adapter
        if generation.sampling is not None:
            attributes[semconv.LLM_ENGINE_SAMPLING] = generation.sampling
        attributes[semconv.LLM_PROMPT_TOKEN_IDS] = generation.prompt_token_ids
        attributes[semconv.LLM_RESPONSE_TOKEN_IDS] = generation.response_token_ids
        attributes[semconv.LLM_RESPONSE_LOGPROBS] = generation.response_logprobs
        attributes[semconv.LLM_TOKEN_IDS_SOURCE] = (
            generation.token_ids_source if generation.response_token_ids is not None else "none"
        )
        attributes[semconv.LLM_USAGE] = {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        }
    return Span(
        rollout_id=context.rollout_id,
        attempt_id=context.attempt_id,
        sequence_id=context.sequence_id,
        trace_id=context.trace_id or new_trace_id(),
        span_id=context.span_id,
        parent_id=context.parent_id,
        name="llm.chat" if chat else "llm.completion",
        kind=SpanKind.LLM,
        attributes=attributes,
        start_time=started,
        end_time=started + latency_s,
        status=SpanStatus.ERROR if error is not None else SpanStatus.OK,
        status_message=error,
    )


class SpanRecorder:
    """Writes LLM spans to a store in the background, on the proxy's event loop."""

    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._writes: set[asyncio.Task[None]] = set()
        self.written = 0
        self.failed = 0

    def record(self, span: Span) -> None:
        if self.store is None:
            return
        task = asyncio.get_running_loop().create_task(self._write(self.store, span), name="alight-proxy-span")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, store: Store, span: Span) -> None:
        started = time.perf_counter()
        try:
            await store.add_spans([span])
        except Exception as err:  # the call was served; its span is lost, say why
            self.failed += 1
            logger.error(
                "proxy: could not store the LLM span of rollout %s attempt %s: %s: %s",
                span.rollout_id,
                span.attempt_id,
                type(err).__name__,
                err,
            )
        else:
            self.written += 1
            logger.debug("proxy: stored span %s in %.1f ms", span.span_id, 1000 * (time.perf_counter() - started))

    async def flush(self) -> None:
        """Return once every span recorded so far is stored (or its failure logged)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
