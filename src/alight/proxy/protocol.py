"""The OpenAI request side of the proxy: request bodies as pydantic models, their conversion into
engine requests, and OpenAI-style errors.

Bodies allow extra fields: provider-specific ones (`presence_penalty`, vLLM's `top_k`, ...) travel
to the engine in `extra`; the ones the proxy itself acts on are named here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alight import semconv
from alight.engines.base import ChatRequest, CompletionRequest, SamplingParams
from alight.errors import one_line
from alight.serving.app import AnsweredError

INVALID_REQUEST = "invalid_request_error"

#: Sampling fields engines take as they are: they travel in `extra` like any provider-specific field.
_PASSED_THROUGH = frozenset({"presence_penalty", "frequency_penalty"})
#: Request fields the proxy handles itself; everything else unknown goes to the engine in `extra`.
_HANDLED = (frozenset(semconv.LLM_SAMPLING_KEYS) - _PASSED_THROUGH) | {
    "model",
    "messages",
    "prompt",
    "tools",
    "tool_choice",
    "response_format",
    "stream",
    "stream_options",
    "return_token_ids",
    "echo",
    "suffix",
}


class ProxyError(AnsweredError):
    """An error answered to the client as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        error = {"message": one_line(str(self)), "type": self.type, "param": self.param, "code": self.code}
        return orjson.dumps({"error": error})


def openai_error_body(status: int, code: str | None, message: str) -> bytes:
    """An error of the proxy's app in OpenAI's format: a server error from 500 up."""
    kind = "server_error" if status >= 500 else INVALID_REQUEST
    return ProxyError(message, status=status, type=kind, code=code).body()


def validation_error(err: ValidationError, prefix: str = "") -> ProxyError:
    """The first problem of a failed body validation as a 400, with OpenAI's `param` path (under
    `prefix` when what failed is a part of the body, like `input[2]`)."""
    problems = err.errors(include_url=False, include_context=False, include_input=False)
    first = problems[0]
    param = prefix
    for part in first["loc"]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _is_union_branch(str(part)):
            param += ("." if param else "") + str(part)
    if first["type"] == "missing":
        return ProxyError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    more = len(problems) - 1
    message = f"Invalid value for '{param}': {first['msg']}" + (f" (and {more} more errors)" if more else "")
    return ProxyError(message, param=param or None, code="invalid_value")


def _is_union_branch(part: str) -> bool:
    """pydantic names the branch of a union in the error location (`str`, `list[TextPart]`)."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part or part.startswith("function-")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 in OpenAI's words."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ProxyError(f"We could not parse the JSON body of your request: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProxyError("The request body must be a JSON object.", code="invalid_json")
    return data


# -- bodies ------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Strict):
    type: Literal["text", "input_text", "output_text"]
    text: str


Content = str | list[TextPart]


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(_Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def plain(self) -> dict[str, Any]:
        """The message as the engine takes it: text content as one string, `developer` as `system`."""
        out: dict[str, Any] = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            out["content"] = "".join(part.text for part in self.content)
        if self.role == "developer":
            out["role"] = "system"
        if self.role != "assistant" and out.get("content") is None:
            raise ProxyError(
                f"Messages with role '{self.role}' need 'content'.", param="messages", code="invalid_value"
            )
        return out


class FunctionDef(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _is_object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON schema of type 'object'")
        return value


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampled(_Body):
    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None  # torch's seed range
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # alight extension: answer with an `alight` object (token ids)

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        if self.n != 1:
            raise ProxyError("Only n=1 is supported.", param="n", code="unsupported_value")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            max_tokens=max_tokens,
            stop=stop,
            seed=self.seed,
        )

    def extra(self) -> dict[str, Any]:
        return {key: value for key, value in (self.model_extra or {}).items() if key not in _HANDLED}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatBody(_Sampled):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def to_request(self) -> ChatRequest:
        tools = [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None
        if self.tools and isinstance(self.tool_choice, dict):
            function = self.tool_choice.get("function")
            wanted = function.get("name") if isinstance(function, dict) else None
            if not isinstance(wanted, str) or wanted not in {tool.function.name for tool in self.tools}:
                raise ProxyError(f"tool_choice names an unknown function {wanted!r}.", param="tool_choice")
        return ChatRequest(
            model=self.model,
            messages=[message.plain() for message in self.messages],
            tools=tools,
            tool_choice=self.tool_choice,
            response_format=self.response_format,
            sampling=self.sampling(self.max_completion_tokens or self.max_tokens),
            extra=self.extra(),
        )


class CompletionBody(_Sampled):
    """POST /v1/completions (one prompt: text or token ids)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16  # the OpenAI default for this route
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False

    def to_request(self) -> CompletionRequest:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ProxyError("Only one prompt per request is supported.", param="prompt", code="unsupported_value")
            prompt = prompt[0]
        if self.echo:
            raise ProxyError("echo is not supported.", param="echo", code="unsupported_value")
        return CompletionRequest(
            model=self.model,
            prompt=prompt,  # type: ignore[arg-type]  # narrowed to str | list[int] above
            sampling=self.sampling(self.max_tokens),
            extra=self.extra(),
        )
