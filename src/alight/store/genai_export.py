"""Alight's spans as OpenTelemetry GenAI spans: the attributes `alight trace --otlp` adds on export.

`to_genai` gives, for each span, the GenAI attributes of what it is (never one the span already
has): LLM spans as `chat` (or `text_completion`) spans with model, messages, answer, finish
reason, sampling, tool definitions and usage tokens (the usage the call reported, else its token
id counts); tool spans as `execute_tool` with name, call id, arguments and result; agent spans as
`invoke_agent` with `gen_ai.agent.name`; `error.type` on failed spans. Structured values are JSON
text, as OTel attributes carry them. Reading them back is `alight.store.genai.from_genai`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alight import semconv
from alight.store import genai
from alight.types import SpanKind


def to_genai(kind: SpanKind, name: str, attributes: Mapping[str, Any], *, error: bool) -> dict[str, Any]:
    """The GenAI attributes of an alight span, as OpenTelemetry attributes (structured values as
    JSON text), leaving out any the span already has."""
    a = attributes
    out: dict[str, Any] = {}
    if kind is SpanKind.LLM:
        out.update(_llm_genai(a))
    elif kind is SpanKind.TOOL:
        out[semconv.GEN_AI_OPERATION] = "execute_tool"
        out[semconv.GEN_AI_TOOL_NAME] = str(a.get(semconv.TOOL_NAME) or name)
        out[semconv.GEN_AI_TOOL_TYPE] = "function"
        if a.get(semconv.TOOL_CALL_ID) is not None:
            out[semconv.GEN_AI_TOOL_CALL_ID] = str(a[semconv.TOOL_CALL_ID])
        if a.get(semconv.TOOL_ARGUMENTS) is not None:
            out[semconv.GEN_AI_TOOL_CALL_ARGUMENTS] = genai.json_text(a[semconv.TOOL_ARGUMENTS], "")
        if a.get(semconv.TOOL_OUTPUT) is not None:
            out[semconv.GEN_AI_TOOL_CALL_RESULT] = genai.json_text(a[semconv.TOOL_OUTPUT], "")
    elif kind is SpanKind.AGENT:
        out[semconv.GEN_AI_OPERATION] = "invoke_agent"
        out[semconv.GEN_AI_AGENT_NAME] = str(a.get(semconv.AGENT_NAME) or name)
    if kind is not SpanKind.AGENT and a.get(semconv.AGENT_NAME) is not None:
        out[semconv.GEN_AI_AGENT_NAME] = str(a[semconv.AGENT_NAME])
    if error or (kind is SpanKind.TOOL and a.get(semconv.TOOL_ERROR)):
        out[semconv.ERROR_TYPE] = str(a.get(semconv.EXCEPTION_TYPE) or "_OTHER")
    return {key: value for key, value in out.items() if key not in attributes}


def _llm_genai(a: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    completions = a.get(semconv.LLM_API) == "completions" or (
        semconv.LLM_REQUEST_PROMPT in a and semconv.LLM_REQUEST_MESSAGES not in a
    )
    out[semconv.GEN_AI_OPERATION] = "text_completion" if completions else "chat"
    if a.get(semconv.LLM_SOURCE) == "proxy":
        out[semconv.GEN_AI_PROVIDER] = "alight"
    if a.get(semconv.LLM_REQUEST_MODEL) is not None:
        out[semconv.GEN_AI_REQUEST_MODEL] = str(a[semconv.LLM_REQUEST_MODEL])
    if a.get(semconv.LLM_RESPONSE_MODEL) is not None:
        out[semconv.GEN_AI_RESPONSE_MODEL] = str(a[semconv.LLM_RESPONSE_MODEL])
    usage = a.get(semconv.LLM_USAGE)
    usage = usage if isinstance(usage, Mapping) else {}
    prompt_ids, response_ids = a.get(semconv.LLM_PROMPT_TOKEN_IDS), a.get(semconv.LLM_RESPONSE_TOKEN_IDS)
    inputs = usage.get("prompt_tokens", len(prompt_ids) if isinstance(prompt_ids, list) else None)
    outputs = usage.get("completion_tokens", len(response_ids) if isinstance(response_ids, list) else None)
    if isinstance(inputs, int):
        out[semconv.GEN_AI_INPUT_TOKENS] = inputs
    if isinstance(outputs, int):
        out[semconv.GEN_AI_OUTPUT_TOKENS] = outputs
    finish = a.get(semconv.LLM_FINISH_REASON)
    if finish is not None:
        out[semconv.GEN_AI_FINISH_REASONS] = [str(finish)]
    messages = a.get(semconv.LLM_REQUEST_MESSAGES)
    if isinstance(messages, list):
        parts = [_genai_message(m) for m in messages if isinstance(m, Mapping)]
        out[semconv.GEN_AI_INPUT_MESSAGES] = genai.dumps(parts)
    elif isinstance(a.get(semconv.LLM_REQUEST_PROMPT), str):
        prompt = {"role": "user", "parts": [{"type": "text", "content": a[semconv.LLM_REQUEST_PROMPT]}]}
        out[semconv.GEN_AI_INPUT_MESSAGES] = genai.dumps([prompt])
    reply = a.get(semconv.LLM_RESPONSE_MESSAGE)
    if not isinstance(reply, Mapping) and isinstance(a.get(semconv.LLM_RESPONSE_TEXT), str):
        reply = {"role": "assistant", "content": a[semconv.LLM_RESPONSE_TEXT]}
    if isinstance(reply, Mapping):
        message = _genai_message({**reply, "role": reply.get("role") or "assistant"})
        message["finish_reason"] = str(finish) if finish is not None else "stop"
        out[semconv.GEN_AI_OUTPUT_MESSAGES] = genai.dumps([message])
    tools = a.get(semconv.LLM_REQUEST_TOOLS)
    if isinstance(tools, list) and tools:
        out[semconv.GEN_AI_TOOL_DEFINITIONS] = genai.dumps([_genai_tool(t) for t in tools if isinstance(t, Mapping)])
    sampling = a.get(semconv.LLM_REQUEST_SAMPLING)
    if isinstance(sampling, Mapping):
        for attr, key in genai.SAMPLING.items():
            value = sampling.get(key)
            if key == "stop" and isinstance(value, str):
                value = [value]
            if isinstance(value, str | int | float) or (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                out[attr] = value
    if isinstance(a.get(semconv.LLM_STREAM), bool):
        out[semconv.GEN_AI_REQUEST_STREAM] = a[semconv.LLM_STREAM]
    return out


def _genai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI chat message in GenAI's shape: role and parts."""
    role = str(message.get("role") or "user")
    parts: list[dict[str, Any]] = []
    if role == "tool":
        response = message.get("content")
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": response})
    else:
        text = genai.content_text(message.get("content"))
        if text:
            parts.append({"type": "text", "content": text})
        for call in message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function") or {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": genai.structured(function.get("arguments")),
                }
            )
    out: dict[str, Any] = {"role": role, "parts": parts}
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _genai_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if not isinstance(function, Mapping):
        return dict(tool)
    return {"type": str(tool.get("type") or "function"), **{k: v for k, v in function.items() if v is not None}}
