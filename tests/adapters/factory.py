"""Hand-made spans for adapter and algorithm tests: `Span` objects in the shapes the proxy and tracers write."""

from __future__ import annotations

from typing import Any

from alight import semconv
from alight.types import Span, SpanKind, SpanStatus


class Trace:
    """Builds the spans of one attempt in order; every span gets the next sequence id."""

    def __init__(self, rollout_id: str = "ro-1", attempt_id: str = "at-1") -> None:
        self.rollout_id, self.attempt_id = rollout_id, attempt_id
        self.spans: list[Span] = []
        self._seq = 0

    def _add(self, name: str, kind: SpanKind, attributes: dict[str, Any], **fields: Any) -> Span:
        self._seq += 1
        fields.setdefault("sequence_id", self._seq)
        fields.setdefault("start_time", 1000.0 + self._seq)
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            name=name,
            kind=kind,
            attributes=attributes,
            span_id=f"{self.rollout_id}-s{self._seq}",
            **fields,
        )
        self.spans.append(span)
        return span

    def llm(
        self,
        prompt: list[int] | None,
        response: list[int] | None,
        *,
        agent: str | None = "writer",
        logprobs: list[float] | bool | None = True,
        messages: list[dict[str, Any]] | None = None,
        reply: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Span:
        attributes: dict[str, Any] = {semconv.LLM_SOURCE: "proxy" if prompt is not None else "client"}
        if agent is not None:
            attributes[semconv.AGENT_NAME] = agent
        if prompt is not None:
            attributes[semconv.LLM_PROMPT_TOKEN_IDS] = prompt
        if response is not None:
            attributes[semconv.LLM_RESPONSE_TOKEN_IDS] = response
            if logprobs is True:
                attributes[semconv.LLM_RESPONSE_LOGPROBS] = [-0.5] * len(response)
            elif isinstance(logprobs, list):
                attributes[semconv.LLM_RESPONSE_LOGPROBS] = logprobs
        if messages is not None:
            attributes[semconv.LLM_REQUEST_MESSAGES] = messages
        if reply is not None:
            attributes[semconv.LLM_RESPONSE_MESSAGE] = reply
        return self._add("llm.chat", SpanKind.LLM, attributes, **fields)

    def tool(
        self,
        name: str,
        *,
        error: bool = False,
        exit_status: int | None = None,
        sql: str | None = None,
        agent: str | None = "writer",
        **fields: Any,
    ) -> Span:
        attributes: dict[str, Any] = {semconv.TOOL_NAME: name, semconv.TOOL_ERROR: error}
        if exit_status is not None:
            attributes[semconv.TOOL_EXIT_STATUS] = exit_status
        if sql is not None:
            attributes[semconv.TOOL_SQL] = sql
        if agent is not None:
            attributes[semconv.AGENT_NAME] = agent
        status = SpanStatus.ERROR if error else SpanStatus.OK
        return self._add(name, SpanKind.TOOL, attributes, status=status, **fields)

    def reward(self, value: float, name: str | None = None, **fields: Any) -> Span:
        attributes: dict[str, Any] = {semconv.REWARD_VALUE: value, semconv.REWARD_SOURCE: "agent"}
        if name is not None:
            attributes[semconv.REWARD_NAME] = name
        return self._add("reward", SpanKind.REWARD, attributes, **fields)

    def agent(self, name: str, **fields: Any) -> Span:
        return self._add(name, SpanKind.AGENT, {semconv.AGENT_NAME: name}, **fields)

    def dicts(self) -> list[dict[str, Any]]:
        """The spans as plain dicts in Span's JSON shape (what a bulk store read hands over)."""
        return [span.model_dump(mode="json") for span in self.spans]
