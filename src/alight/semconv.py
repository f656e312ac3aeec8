"""Span conventions: the attribute names every span producer writes and every consumer reads.

Producers are the LLM proxy (LLM spans with token ids), the tracers and their instrumentation
(agent, tool, reward and exception spans, and LLM spans for calls that bypass the proxy), and the
OTLP receiver (spans from any OpenTelemetry SDK). The adapter reads them. Values are plain JSON;
through OpenTelemetry, whose attributes cannot hold nested objects, the keys in `JSON_ATTRIBUTES`
travel as JSON strings and are decoded on the way into the store.
"""

from __future__ import annotations

# -- which rollout a span belongs to (OTel resource or span attributes; HTTP headers to the proxy) --
ROLLOUT_ID = "alight.rollout_id"
ATTEMPT_ID = "alight.attempt_id"
SPAN_KIND = "alight.span.kind"  # one of alight.types.SpanKind, for spans that come through OTel
RESOURCE_PREFIX = "resource."  # OTLP ingest: the sender's resource attributes, e.g. resource.service.name
OTEL_EVENTS = "otel.events"  # OTLP ingest: the span's events, [{"name", "time_unix_nano", "attributes"}]

# -- every span made inside an agent --
AGENT_NAME = "alight.agent.name"  # which agent (of a multi-agent workflow) made the span
RESOURCES_VERSION = "alight.resources_version"  # resource set / weights version that served an LLM call
#: The agent name of an LLM judge's calls (reward.kind=judge): recorded, never trained on (the adapter drops them).
JUDGE_AGENT = "alight.judge"

# -- LLM calls (kind=llm, name "llm.chat" or "llm.completion") --
LLM_SOURCE = "llm.source"  # "proxy" (alight's proxy wrote it, with token ids), "client" (instrumentation) or:
LLM_SOURCE_OTEL = "otel"  # an OTel GenAI inference span received over OTLP (a report of a call, no token ids)
LLM_API = "llm.api"  # the OpenAI API the client called: "chat", "completions" or "responses"
LLM_REQUEST_MESSAGES = "llm.request.messages"  # list of OpenAI chat messages
LLM_REQUEST_PROMPT = "llm.request.prompt"  # completions API: the prompt text
LLM_REQUEST_TOOLS = "llm.request.tools"  # list of OpenAI tool definitions, or absent
LLM_REQUEST_MODEL = "llm.request.model"
LLM_REQUEST_SAMPLING = "llm.request.sampling"  # dict: the call's LLM_SAMPLING_KEYS (and provider extras)
LLM_ENGINE_SAMPLING = "llm.engine.sampling"  # dict: every setting the engine sampled with (its defaults included)
LLM_STREAM = "llm.stream"  # bool: the client asked for a streamed answer
LLM_RESPONSE_MESSAGE = "llm.response.message"  # OpenAI assistant message: role, content, tool_calls
LLM_RESPONSE_TEXT = "llm.response.text"  # completions API: the generated text
LLM_FINISH_REASON = "llm.response.finish_reason"
LLM_RESPONSE_MODEL = "llm.response.model"
LLM_PROMPT_TOKEN_IDS = "llm.prompt_token_ids"  # list[int]: the exact prompt the engine saw
LLM_RESPONSE_TOKEN_IDS = "llm.response_token_ids"  # list[int]: the tokens the engine generated
LLM_RESPONSE_LOGPROBS = "llm.response_logprobs"  # list[float], one per response token
LLM_TOKEN_IDS_SOURCE = "llm.token_ids_source"  # "engine", "tokenizer" or "none" (text only)
LLM_USAGE = "llm.usage"  # dict: prompt_tokens, completion_tokens, total_tokens
LLM_LATENCY_S = "llm.latency_s"
LLM_ADAPTER = "llm.adapter"  # the per-agent LoRA adapter that answered (absent: the base weights)

# -- tool calls (kind=tool, name = the tool's name) --
TOOL_NAME = "tool.name"
TOOL_CALL_ID = "tool.call_id"
TOOL_ARGUMENTS = "tool.arguments"  # JSON string or dict, as the model produced it
TOOL_OUTPUT = "tool.output"
TOOL_ERROR = "tool.error"  # bool: the tool raised or reported failure
TOOL_EXIT_STATUS = "tool.exit_status"  # int, for tools that run a process
TOOL_SQL = "tool.sql"  # the SQL statement a database tool ran (AIR rules look at it)

# -- rewards (kind=reward, name "reward") --
REWARD_VALUE = "reward.value"  # float
REWARD_NAME = "reward.name"  # optional label: "final", "format", "exec", ...
REWARD_SOURCE = "reward.source"  # "agent" (emitted or returned) or "air" (automatic rule)

# -- exceptions (kind=other, name "exception", status error; OpenTelemetry's names) --
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"

#: The OpenAI request fields that set sampling: LLM_REQUEST_SAMPLING holds those a call gave, by these names.
LLM_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
)

#: Attributes that hold lists or objects: sent as JSON strings through OpenTelemetry.
JSON_ATTRIBUTES = frozenset(
    {
        LLM_REQUEST_MESSAGES,
        LLM_REQUEST_TOOLS,
        LLM_REQUEST_SAMPLING,
        LLM_ENGINE_SAMPLING,
        LLM_RESPONSE_MESSAGE,
        LLM_PROMPT_TOKEN_IDS,
        LLM_RESPONSE_TOKEN_IDS,
        LLM_RESPONSE_LOGPROBS,
        LLM_USAGE,
        TOOL_ARGUMENTS,
        TOOL_OUTPUT,
    }
)

# -- HTTP headers from an agent's LLM client to the proxy --
HEADER_ROLLOUT_ID = "x-alight-rollout-id"  # for clients that cannot put the ids in the base URL path
HEADER_ATTEMPT_ID = "x-alight-attempt-id"
HEADER_AGENT_NAME = "x-alight-agent"  # the agent making the call (set by instrumentation)
HEADER_PARENT_SPAN_ID = "x-alight-parent-span-id"  # the client-side span the call happens under
HEADER_TRACE_ID = "x-alight-trace-id"
HEADER_SEQUENCE_ID = "x-alight-sequence-id"  # the call's place among the attempt's spans (client counter)
SEQUENCE_ID = "alight.sequence_id"  # the same, as an OTel span attribute

# -- OpenTelemetry's GenAI conventions (semconv 1.3x-1.4x, "Development"): read on OTLP ingest, written on export --
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_OLD_INPUT_TOKENS = "gen_ai.usage.prompt_tokens"  # before semconv 1.27
GEN_AI_OLD_OUTPUT_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
ERROR_TYPE = "error.type"
PLAIN_AGENT_NAME = "agent.name"  # not GenAI's, but what several frameworks put on their agent spans
