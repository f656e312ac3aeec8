"""OpenTelemetry's GenAI semantic conventions, read into alight's span conventions and written back.

On OTLP ingest, `from_genai` adds alight's attributes (`alight.semconv`) for what a GenAI span
says in OTel's words, keeping the span's own attributes as they came: an inference span
(`gen_ai.operation.name` chat / text_completion / generate_content) becomes an LLM span with its
model, messages (OpenAI chat shape), answer, finish reason, sampling, tools and usage; an
`execute_tool` span a tool span (name, call id, arguments, result); an `invoke_agent` or
`create_agent` span, or any span carrying `gen_ai.agent.name` or `agent.name`, names its agent.
Both the current conventions (`gen_ai.input.messages` / `gen_ai.output.messages` /
`gen_ai.system_instructions` as JSON) and the older ones (indexed `gen_ai.prompt.N.*` /
`gen_ai.completion.N.*` attributes, `gen_ai.usage.prompt_tokens`, the `gen_ai.content.prompt` /
`gen_ai.content.completion` and `gen_ai.*.message` / `gen_ai.choice` span events) are read.

The way back, alight's spans as GenAI spans, is `alight.store.genai_export`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from alight import semconv
from alight.types import SpanKind

#: Operations by the alight span kind they map to.
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATIONS = frozenset({"execute_tool"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent"})

#: GenAI request attributes <-> the OpenAI sampling keys alight keeps in LLM_REQUEST_SAMPLING.
SAMPLING = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.choice.count": "n",
    "gen_ai.request.presence_penalty": "presence_penalty",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
}
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")


def is_genai(name: str, attributes: Mapping[str, Any]) -> bool:
    """Whether a span says anything `from_genai` reads (a cheap test for the hot path)."""
    return semconv.PLAIN_AGENT_NAME in attributes or any(key.startswith("gen_ai.") for key in attributes)


def from_genai(
    name: str, attributes: MutableMapping[str, Any], events: Sequence[Mapping[str, Any]] = ()
) -> SpanKind | None:
    """Add alight's attributes for the GenAI ones `attributes` holds (in place; an attribute already
    there is kept); returns the span kind `gen_ai.operation.name` says, or None when it says none.
    `events` are the span's events as {"name", "attributes"} dicts (older conventions put messages there)."""
    operation = attributes.get(semconv.GEN_AI_OPERATION)
    kind: SpanKind | None = None
    if operation in LLM_OPERATIONS:
        kind = SpanKind.LLM
    elif operation in TOOL_OPERATIONS:
        kind = SpanKind.TOOL
    elif operation in AGENT_OPERATIONS:
        kind = SpanKind.AGENT
    elif operation == "embeddings":
        kind = SpanKind.OTHER  # no chat turn to train on: not counted as an LLM call
    agent = attributes.get(semconv.GEN_AI_AGENT_NAME) or attributes.get(semconv.PLAIN_AGENT_NAME)
    if agent is not None and semconv.AGENT_NAME not in attributes:
        attributes[semconv.AGENT_NAME] = str(agent)
    if kind is SpanKind.TOOL or (kind is None and semconv.GEN_AI_TOOL_NAME in attributes):
        _tool(name, attributes)
    elif kind is not SpanKind.AGENT and kind is not SpanKind.OTHER:
        _llm(operation, attributes, events)
    return kind


def _put(attributes: MutableMapping[str, Any], key: str, value: Any) -> None:
    if value is not None and key not in attributes:
        attributes[key] = value


def _tool(name: str, a: MutableMapping[str, Any]) -> None:
    _put(a, semconv.TOOL_NAME, a.get(semconv.GEN_AI_TOOL_NAME) or name.removeprefix("execute_tool ").strip() or None)
    _put(a, semconv.TOOL_CALL_ID, a.get(semconv.GEN_AI_TOOL_CALL_ID))
    _put(a, semconv.TOOL_ARGUMENTS, structured(a.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS)))
    _put(a, semconv.TOOL_OUTPUT, structured(a.get(semconv.GEN_AI_TOOL_CALL_RESULT)))
    if semconv.ERROR_TYPE in a:
        _put(a, semconv.TOOL_ERROR, True)


def _llm(operation: Any, a: MutableMapping[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
    models = (
        (semconv.GEN_AI_REQUEST_MODEL, semconv.LLM_REQUEST_MODEL),
        (semconv.GEN_AI_RESPONSE_MODEL, semconv.LLM_RESPONSE_MODEL),
    )
    for key, target in models:
        if a.get(key) is not None:
            _put(a, target, str(a[key]))
    usage = _usage(a)
    if usage:
        _put(a, semconv.LLM_USAGE, usage)
    messages = _input_messages(a, events)
    reply, finish = _output_message(a, events)
    if operation == "text_completion":
        _put(a, semconv.LLM_API, "completions")
        if messages:
            _put(a, semconv.LLM_REQUEST_PROMPT, "".join(content_text(m.get("content")) for m in messages))
        if reply is not None:
            _put(a, semconv.LLM_RESPONSE_TEXT, content_text(reply.get("content")))
    else:
        if messages is not None:
            _put(a, semconv.LLM_REQUEST_MESSAGES, messages)
        if reply is not None:
            _put(a, semconv.LLM_RESPONSE_MESSAGE, reply)
        if operation is not None or messages is not None or reply is not None:
            _put(a, semconv.LLM_API, "chat")
    reasons = a.get(semconv.GEN_AI_FINISH_REASONS)
    if finish is None and isinstance(reasons, list | tuple) and reasons:
        finish = reasons[0]
    _put(a, semconv.LLM_FINISH_REASON, finish)
    sampling = {key: a[attr] for attr, key in SAMPLING.items() if a.get(attr) is not None}
    if sampling:
        _put(a, semconv.LLM_REQUEST_SAMPLING, sampling)
    tools = _tool_definitions(a.get(semconv.GEN_AI_TOOL_DEFINITIONS))
    if tools:
        _put(a, semconv.LLM_REQUEST_TOOLS, tools)
    if isinstance(a.get(semconv.GEN_AI_REQUEST_STREAM), bool):
        _put(a, semconv.LLM_STREAM, a[semconv.GEN_AI_REQUEST_STREAM])
    if semconv.LLM_API in a or semconv.LLM_USAGE in a or semconv.LLM_REQUEST_MODEL in a:
        _put(a, semconv.LLM_SOURCE, semconv.LLM_SOURCE_OTEL)


def _usage(a: Mapping[str, Any]) -> dict[str, int]:
    usage: dict[str, int] = {}
    for keys, target in (
        ((semconv.GEN_AI_INPUT_TOKENS, semconv.GEN_AI_OLD_INPUT_TOKENS), "prompt_tokens"),
        ((semconv.GEN_AI_OUTPUT_TOKENS, semconv.GEN_AI_OLD_OUTPUT_TOKENS), "completion_tokens"),
    ):
        for key in keys:
            value = a.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                usage[target] = value
                break
    if len(usage) == 2:
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


# -- messages: GenAI parts -> OpenAI chat messages ------------------------------------------------


def _input_messages(a: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    raw = _decoded(a.get(semconv.GEN_AI_INPUT_MESSAGES))
    messages: list[dict[str, Any]] | None = None
    if isinstance(raw, list):
        messages = [m for message in raw if isinstance(message, Mapping) for m in _openai_messages(message)]
    else:
        messages = _indexed(a, "prompt") or _event_prompt(events)
    system = _decoded(a.get(semconv.GEN_AI_SYSTEM_INSTRUCTIONS))
    if system is not None and not any(m.get("role") == "system" for m in messages or ()):
        text = _parts_text(system) if isinstance(system, list) else str(system)
        messages = [{"role": "system", "content": text}, *(messages or [])]
    return messages


def _output_message(a: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any] | None, Any]:
    raw = _decoded(a.get(semconv.GEN_AI_OUTPUT_MESSAGES))
    if isinstance(raw, list) and raw and isinstance(raw[0], Mapping):
        first = raw[0]
        messages = _openai_messages({**first, "role": first.get("role") or "assistant"})
        return (messages[0] if messages else None), first.get("finish_reason")
    completions = _indexed(a, "completion")
    if completions:
        finish = a.get("gen_ai.completion.0.finish_reason")
        return completions[0], finish
    return _event_completion(events)


def _openai_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One GenAI chat message as OpenAI chat messages (a message of tool results becomes one per result)."""
    role = str(message.get("role") or "user")
    parts = message.get("parts")
    if not isinstance(parts, list):  # not GenAI's shape: maybe OpenAI's already
        return [dict(message)] if "content" in message or "tool_calls" in message else []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("content") or ""))
        elif kind == "tool_call":
            arguments = part.get("arguments")
            calls.append(
                {
                    "id": part.get("id"),
                    "type": "function",
                    "function": {"name": part.get("name"), "arguments": json_text(arguments, "{}")},
                }
            )
        elif kind == "tool_call_response":
            result = part.get("response", part.get("result"))
            results.append({"role": "tool", "tool_call_id": part.get("id"), "content": json_text(result, "")})
    if results:
        return results
    out: dict[str, Any] = {"role": role, "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if message.get("name"):
        out["name"] = message["name"]
    return [out]


def _indexed(a: Mapping[str, Any], which: str) -> list[dict[str, Any]]:
    """Messages of the older indexed attributes: gen_ai.prompt.0.role, gen_ai.prompt.0.content, ..."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in a.items():
        match = _INDEXED.match(key)
        if match is None or match.group(1) != which:
            continue
        index, field = int(match.group(2)), match.group(3)
        message = found.setdefault(index, {})
        if field in ("role", "content", "tool_call_id", "name"):
            message[field] = value
        elif field.startswith("tool_calls."):
            _, number, what = [*field.split(".", 2), "", ""][:3]
            if number.isdigit():
                calls = message.setdefault("_calls", {})
                call = calls.setdefault(int(number), {"type": "function", "function": {}})
                if what == "id":
                    call["id"] = value
                elif what in ("name", "arguments"):
                    call["function"][what] = value
    messages = []
    for index in sorted(found):
        message = found[index]
        calls = message.pop("_calls", None)
        message.setdefault("role", "user" if which == "prompt" else "assistant")
        message.setdefault("content", None)
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        messages.append(message)
    return messages


def _event_prompt(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    messages: list[dict[str, Any]] = []
    for event in events:
        name, attributes = event.get("name"), event.get("attributes") or {}
        if name == "gen_ai.content.prompt":
            decoded = _decoded(attributes.get("gen_ai.prompt"))
            if isinstance(decoded, list):
                return [dict(m) for m in decoded if isinstance(m, Mapping)]
        elif isinstance(name, str) and name.startswith("gen_ai.") and name.endswith(".message"):
            role = attributes.get("role") or name.removeprefix("gen_ai.").removesuffix(".message")
            message: dict[str, Any] = {"role": role, "content": _decoded(attributes.get("content"))}
            calls = _decoded(attributes.get("tool_calls"))
            if isinstance(calls, list):
                message["tool_calls"] = calls
            if attributes.get("id") is not None and role == "tool":
                message["tool_call_id"] = attributes["id"]
            messages.append(message)
    return messages or None


def _event_completion(events: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any] | None, Any]:
    for event in events:
        name, attributes = event.get("name"), event.get("attributes") or {}
        if name == "gen_ai.content.completion":
            decoded = _decoded(attributes.get("gen_ai.completion"))
            if isinstance(decoded, list) and decoded and isinstance(decoded[0], Mapping):
                return dict(decoded[0]), decoded[0].get("finish_reason")
            if isinstance(decoded, str):
                return {"role": "assistant", "content": decoded}, None
        elif name == "gen_ai.choice":
            body = _decoded(attributes.get("message"))
            message = dict(body) if isinstance(body, Mapping) else {"content": _decoded(attributes.get("content"))}
            message.setdefault("role", "assistant")
            return message, attributes.get("finish_reason")
    return None, None


def _tool_definitions(raw: Any) -> list[dict[str, Any]]:
    """GenAI tool definitions ({"type", "name", "description", "parameters"}) in OpenAI's shape."""
    tools: list[dict[str, Any]] = []
    decoded = _decoded(raw)
    for tool in decoded if isinstance(decoded, list) else ():
        if not isinstance(tool, Mapping):
            continue
        if "function" in tool:  # OpenAI's shape already
            tools.append(dict(tool))
        elif tool.get("name"):
            function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
            tools.append({"type": "function", "function": function})
    return tools


# -- values ---------------------------------------------------------------------------------------


def _decoded(value: Any) -> Any:
    """A JSON attribute's value: OTel attributes carry structures as JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def structured(value: Any) -> Any:
    """JSON text of an object or array decoded; any other value (plain text, numbers) as it is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def json_text(value: Any, empty: str) -> str:
    if value is None:
        return empty
    return value if isinstance(value, str) else dumps(value)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def content_text(content: Any) -> str:
    """The text of an OpenAI message content: a string, or a list of parts ({"type": "text", "text"})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or p.get("content") or "") for p in content if isinstance(p, Mapping))
    return str(content)


def _parts_text(parts: list[Any]) -> str:
    return "\n".join(str(p.get("content") or "") for p in parts if isinstance(p, Mapping) and p.get("type") == "text")
