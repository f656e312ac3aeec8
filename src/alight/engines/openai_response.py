"""OpenAI-format responses (from vLLM, SGLang, LiteLLM...) turned into `Generation`s, and the
optional sampling fields of the requests that ask for them.

vLLM adds token ids when asked (`return_token_ids: true`): chat responses carry
`prompt_token_ids` at the top level and `token_ids` on each choice; completion choices carry both.
LiteLLM moves unknown choice fields into `provider_specific_fields`; both places are read here.
"""

from __future__ import annotations

from typing import Any

from alight.engines.base import Generation, SamplingParams, TokenIdsSource


def optional_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """The request fields of the sampling parameters that are set: max_tokens, stop, seed."""
    fields: dict[str, Any] = {}
    if sampling.max_tokens is not None:
        fields["max_tokens"] = sampling.max_tokens
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def _field(data: dict[str, Any], choice: dict[str, Any], name: str) -> Any:
    """A vLLM extension field wherever the response keeps it."""
    extra = choice.get("provider_specific_fields") or {}
    for place in (choice, extra, data):
        if isinstance(place, dict) and place.get(name) is not None:
            return place[name]
    return None


def _logprobs(choice: dict[str, Any]) -> list[float] | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):  # chat format
        values = [item.get("logprob") for item in logprobs["content"] if isinstance(item, dict)]
    elif isinstance(logprobs.get("token_logprobs"), list):  # completions format
        values = list(logprobs["token_logprobs"])
    else:
        return None
    out: list[float] = []
    for value in values:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        out.append(float(value))
    return out


def finish_reason(value: Any) -> str:
    """OpenAI's finish reasons folded into the three alight records."""
    if value in ("tool_calls", "function_call"):
        return "tool_calls"
    return "length" if value == "length" else "stop"


def assistant_from_response(message: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI assistant message with only the fields alight records (role, content, tool_calls)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        calls.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function.get("name"), "arguments": arguments if arguments is not None else "{}"},
            }
        )
    if calls:
        out["tool_calls"] = calls
    return out


def generation_from_response(
    data: dict[str, Any], *, model: str, chat: bool, weights_version: int | None = None
) -> Generation:
    """A Generation from a chat or completions response body (the first choice).

    Token ids come from the response when it has them (token_ids_source "engine"), else the
    Generation records text only ("none"); log-probs are kept when there is one per response id."""
    choice = (data.get("choices") or [{}])[0]
    if chat:
        message = assistant_from_response(choice.get("message") or {})
        text = message.get("content") or ""
    else:
        text = choice.get("text") or ""
        message = {"role": "assistant", "content": text}
    prompt_ids = _ids(_field(data, choice, "prompt_token_ids"))
    response_ids = _ids(_field(data, choice, "token_ids"))
    source: TokenIdsSource = "engine" if prompt_ids is not None and response_ids is not None else "none"
    if source == "none":
        prompt_ids = response_ids = None
    logprobs = _logprobs(choice)
    if response_ids is None or logprobs is None or len(logprobs) != len(response_ids):
        logprobs = None
    usage = data.get("usage") or {}
    reason = finish_reason(choice.get("finish_reason"))
    if message.get("tool_calls") and reason == "stop":
        reason = "tool_calls"
    return Generation(
        model=model,
        text=text,
        message=message,
        finish_reason=reason,
        prompt_token_ids=prompt_ids,
        response_token_ids=response_ids,
        response_logprobs=logprobs,
        token_ids_source=source,
        prompt_tokens=int(usage.get("prompt_tokens") or (len(prompt_ids) if prompt_ids else 0)),
        completion_tokens=int(usage.get("completion_tokens") or (len(response_ids) if response_ids else 0)),
        weights_version=weights_version,
    )
