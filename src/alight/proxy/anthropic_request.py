"""The request of Anthropic's Messages API (`POST /v1/messages`): its body, validated, and the
`ChatRequest` it makes to the engine (see `alight.proxy.anthropic_api` for the translation's
rules); anything a text model cannot serve is a 400 naming it."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from alight.engines.base import ChatRequest, SamplingParams
from alight.proxy.protocol import FunctionDef, ProxyError, _Body, _Strict, validation_error

#: Request fields accepted and ignored (never passed on to the engine).
_IGNORED = frozenset(
    {
        "metadata",
        "thinking",
        "service_tier",
        "cache_control",
        "container",
        "context_management",
        "inference_geo",
        "speed",
        "diagnostics",
        "mcp_servers",
        "user_profile_id",
        "workspace_id",
    }
)
#: Block types a text model can take; any other (image, document, search result, ...) is refused.
_TEXT_BLOCKS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})


class _TextBlock(_Strict):
    type: Literal["text"]
    text: str


class _ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class _ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[_TextBlock] = ""
    is_error: bool = False


class _ThinkingBlock(_Strict):
    type: Literal["thinking", "redacted_thinking"]


_Block = Annotated[_TextBlock | _ToolUseBlock | _ToolResultBlock | _ThinkingBlock, Field(discriminator="type")]


class _Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class MessagesBody(_Body):
    """POST /v1/messages."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[_Message], Field(min_length=1)]
    system: str | list[_TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool = False
    output_config: dict[str, Any] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None  # alight extension, as on the OpenAI routes
    return_token_ids: bool = False  # alight extension: answer with an `alight` object (token ids)

    def to_request(self) -> ChatRequest:
        """The chat request this call makes to the engine, or a 400 naming what cannot be served."""
        messages: list[dict[str, Any]] = []
        system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system or [])
        if system:
            messages.append({"role": "system", "content": system})
        for message in self.messages:
            messages += _chat_messages(message)
        tools = _chat_tools(self.tools or [])
        extra = {key: value for key, value in (self.model_extra or {}).items() if key not in _IGNORED}
        if self.top_k is not None:
            extra["top_k"] = self.top_k
        return ChatRequest(
            model=self.model,
            messages=messages,
            tools=tools or None,
            tool_choice=_chat_tool_choice(self.tool_choice, tools),
            response_format=_response_format(self.output_config),
            sampling=SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                max_tokens=self.max_tokens,
                stop=list(self.stop_sequences or []),
                seed=self.seed,
            ),
            extra=extra,
        )


def parse_body(data: dict[str, Any]) -> MessagesBody:
    """The validated body, or a 400 naming the first problem (unsupported blocks by their type)."""
    messages = data.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else []):  # else: pydantic names it
        content = message.get("content") if isinstance(message, dict) else None
        for at, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in _TEXT_BLOCKS:
                raise ProxyError(
                    f"messages[{index}].content[{at}]: content blocks of type '{kind}' are not supported by the "
                    "alight proxy (text, tool_use and tool_result only)."
                )
    try:
        return MessagesBody.model_validate(data)
    except ValidationError as err:
        raise validation_error(err) from None


def _chat_messages(message: _Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: an assistant turn with its tool calls, or a user turn
    split into its tool results (each a `tool` message) and its text, in their order."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        text = "".join(block.text for block in message.content if isinstance(block, _TextBlock))
        calls = [
            {
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)},
            }
            for block in message.content
            if isinstance(block, _ToolUseBlock)
        ]
        out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            out["tool_calls"] = calls
        return [out]
    chat: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, _ToolResultBlock):
            if texts:
                chat.append({"role": "user", "content": "".join(texts)})
                texts = []
            content = block.content if isinstance(block.content, str) else "".join(b.text for b in block.content)
            chat.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif isinstance(block, _TextBlock):
            texts.append(block.text)
        elif isinstance(block, _ToolUseBlock):
            raise ProxyError("tool_use blocks belong in assistant messages.", param="messages")
    if texts or not chat:
        chat.append({"role": "user", "content": "".join(texts)})
    return chat


def _chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Client tools as chat tools; server tools (typed, like `web_search_20250305`) are refused."""
    others = sorted({str(tool.get("type")) for tool in tools if tool.get("type") not in (None, "custom")})
    if others:
        raise ProxyError(
            f"Tools of type {', '.join(repr(kind) for kind in others)} are not supported by the alight proxy: "
            "only client tools (name, description, input_schema) are."
        )
    chat = []
    for index, tool in enumerate(tools):
        if "input_schema" not in tool:
            raise ProxyError(f"tools[{index}].input_schema: Field required")
        function = {"name": tool.get("name"), "description": tool.get("description")}
        try:
            checked = FunctionDef.model_validate({**function, "parameters": tool["input_schema"]})
        except ValidationError as err:
            raise validation_error(err, prefix=f"tools[{index}]") from None
        chat.append({"type": "function", "function": checked.model_dump(exclude_none=True)})
    return chat


def _chat_tool_choice(choice: dict[str, Any] | None, tools: list[dict[str, Any]]) -> Any:
    if choice is None or not tools:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in {tool["function"]["name"] for tool in tools}:
            raise ProxyError(f"tool_choice names an unknown tool {name!r}.")
        return {"type": "function", "function": {"name": name}}
    raise ProxyError(f"tool_choice.type: {kind!r} is not one of 'auto', 'any', 'tool', 'none'.")


def _response_format(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """`output_config.format` (a JSON schema) as chat's `response_format`."""
    fmt = (config or {}).get("format")
    if not fmt:
        return None
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ProxyError("output_config.format: only {'type': 'json_schema', 'schema': {...}} is supported.")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
