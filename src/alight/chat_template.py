"""OpenAI chat messages checked and rendered through a tokenizer's chat template.

Shared by the engines that tokenize themselves (embedded) or re-tokenize what an endpoint returned
(litellm with a tokenizer), and by the adapter that rebuilds the ids of calls recorded without them:
the prompt ids are the ids of the template text with the generation prompt, so decoding them gives
the template text back. The tokenizer is anything with the `ChatTokenizer` interface (a Hugging
Face tokenizer has it).
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from alight.errors import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


@runtime_checkable
class ChatTokenizer(Protocol):
    """What alight uses of a tokenizer with a chat template (a Hugging Face tokenizer fits)."""

    chat_template: Any  # None: the model has no chat template
    eos_token_id: Any
    unk_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        """The template's text for `conversation` (with `tokenize=False`)."""

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        """Token ids of `text`."""

    def convert_tokens_to_ids(self, tokens: str) -> Any:
        """The id of a token, or the unknown token's."""


def _text_content(content: Any, where: str) -> str | None:
    """Message content as a string: str, None, or a list of {"type": "text", "text": ...} parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"{where}.content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(f"{where}.content must be a string or a list of text parts")


def _template_tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise InvalidRequestError(f'{where} must be an object with a "function" object')
    function = call["function"]
    name, arguments = function.get("name"), function.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name must be a non-empty string")
    if isinstance(arguments, str):
        # OpenAI sends arguments as a JSON string; HF templates expect a mapping (`| tojson`)
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as err:
            raise InvalidRequestError(f"{where}.function.arguments is not valid JSON") from err
    if not isinstance(arguments, dict):
        raise InvalidRequestError(f"{where}.function.arguments must be a JSON object")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """Check OpenAI chat messages and return them in the form chat templates expect.

    Content becomes a string ("" for None, text parts joined); tool-call arguments become dicts.

    Raises:
        InvalidRequestError: not a non-empty list of messages with a known role and text content.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequestError(f"{where} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        content = _text_content(message.get("content"), where)
        if content is None and role != "assistant":
            raise InvalidRequestError(f"{where}.content is missing")
        item: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise InvalidRequestError(f"{where}.tool_calls must be a list on an assistant message")
            item["tool_calls"] = [_template_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                item[key] = message[key]
        out.append(item)
    return out


def render_prompt(tokenizer: ChatTokenizer, messages: Any, tools: list[dict[str, Any]] | None) -> str:
    """The chat-template text of the messages with the generation prompt (tools rendered when given).

    Raises:
        InvalidRequestError: the messages are invalid or the template refuses them.
    """
    converted = template_messages(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("the model's tokenizer has no chat template; use the completions API")
    try:
        text = tokenizer.apply_chat_template(converted, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception as err:  # jinja raises TemplateError and others for input the template rejects
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise InvalidRequestError(f"the chat template rejected the messages: {first_line}") from err
    if not isinstance(text, str):
        raise InvalidRequestError("the chat template did not render to text")
    return text


def render_reply(
    tokenizer: ChatTokenizer, messages: Any, tools: list[dict[str, Any]] | None, reply: dict[str, Any]
) -> str:
    """The text the template puts after the generation prompt for the assistant message `reply`.

    It is the rendered conversation with the reply minus the rendered prompt; "" if the template
    does not render the prompt as a prefix of the conversation (then no response text can be told).
    """
    prompt = render_prompt(tokenizer, messages, tools)
    converted = template_messages([*messages, reply])
    full = tokenizer.apply_chat_template(converted, tools=tools, tokenize=False)
    if not isinstance(full, str) or not full.startswith(prompt):
        return ""
    return full[len(prompt) :]
