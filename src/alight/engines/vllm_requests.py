"""alight's requests to vLLM's OpenAI API, and what their answers and refusals say.

Every request carries `return_token_ids: true` and `skip_special_tokens: false` and every sampling
setting (see `alight.engines.vllm_engine`); the answer becomes a `Generation` with the tool calls
parsed from the raw text, and a refusal's message is read for the context length it states.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from alight.engines.base import NEUTRAL_SAMPLING, ChatRequest, CompletionRequest, Generation, SamplingParams
from alight.engines.openai_response import generation_from_response, optional_sampling
from alight.engines.toolcalls import assistant_message, validate_tools
from alight.errors import one_line

END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>")
# vLLM's context-length refusals: the limit, and the prompt's tokens where it says them
_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT = re.compile(r"(\d+) in the messages|(\d+) input tokens|prompt contains at least (\d+)")


def _body(sampling: SamplingParams, served_name: str, extra: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The fields every vLLM request of alight's carries: ids back, special tokens kept (the
    <tool_call> markup is one in some tokenizers), every sampling setting; then `extra` on top."""
    body: dict[str, Any] = {
        "model": served_name,
        **fields,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        **NEUTRAL_SAMPLING,  # sent, so the model's generation_config.json cannot change them
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    body.update(optional_sampling(sampling))
    return {**body, **extra}


def chat_body(request: ChatRequest, served_name: str, chat_template: str | None = None) -> dict[str, Any]:
    """vLLM chat request body for an alight ChatRequest (`chat_template`: a template text sent with
    the request, for a server alight did not start)."""
    fields: dict[str, Any] = {"messages": request.messages, "logprobs": request.sampling.logprobs}
    tools = validate_tools(request.tools)
    if tools:
        fields["tools"] = tools
        fields["tool_choice"] = "none"  # tools go into the template; alight parses the calls itself
    if request.response_format is not None:
        fields["response_format"] = request.response_format
    if chat_template is not None:
        fields["chat_template"] = chat_template
    return _body(request.sampling, served_name, request.extra, **fields)


def completion_body(request: CompletionRequest, served_name: str) -> dict[str, Any]:
    """vLLM completions request body (prompt text or token ids)."""
    fields: dict[str, Any] = {"prompt": request.prompt}
    if request.sampling.logprobs:
        fields["logprobs"] = 1
    return _body(request.sampling, served_name, request.extra, **fields)


def sampled_with(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling settings a request body asks vLLM for (recorded on the call's span)."""
    keys = ("temperature", "top_p", *NEUTRAL_SAMPLING, "max_tokens", "seed", "stop")
    return {key: body[key] for key in keys if key in body}


def cuts_distribution(body: Mapping[str, Any]) -> bool:
    """Whether vLLM samples this request from a cut distribution (top-k, top-p or min-p): its
    processed log-probs are then renormalised over what the cut kept, not the trainer's."""
    if float(body.get("temperature", 1.0)) <= 0:  # greedy: no cut applies (vLLM's greedy path)
        return False
    top_k = int(body.get("top_k") or 0)
    return float(body.get("top_p", 1.0)) < 1.0 or top_k > 0 or float(body.get("min_p") or 0.0) > 0.0


def generation_from_vllm(
    data: dict[str, Any], *, chat: bool, served_name: str, parse_tools: bool, weights_version: int | None
) -> Generation:
    """A Generation from a vLLM response: ids from vLLM, tool calls parsed from the raw text."""
    generation = generation_from_response(data, model=served_name, chat=chat, weights_version=weights_version)
    text = generation.text
    for end in END_OF_TURN_TEXTS:  # vLLM leaves the stop token out of the text; be sure of it
        text = text.removesuffix(end)
    generation.text = text
    if chat:
        generation.message = assistant_message(text, parse_tools=parse_tools)
        if generation.message.get("tool_calls") and generation.finish_reason == "stop":
            generation.finish_reason = "tool_calls"
    else:
        generation.message = {"role": "assistant", "content": text}
    return generation


def error_message(response: Any) -> str:
    """The one-line message of a vLLM error response (its JSON error's message, else its text)."""
    try:
        body = response.json()
    except ValueError:
        return one_line(response.text, 300) or f"HTTP {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else body.get("message") or body.get("detail")
    return one_line(str(message or body), 300)


def context_overflow(message: str) -> tuple[int, int | None] | None:
    """(the context length, the prompt's tokens where stated) of a vLLM context-length refusal; None
    for any other error. vLLM 0.32 refuses only prompts that fill the context; 0.24-0.31 also refuse
    prompt + max_tokens over it ("... (P in the messages, C in the completion)")."""
    limit = _LIMIT.search(message)
    if limit is None:
        return None
    prompt = _PROMPT.search(message)
    tokens = next((int(g) for g in prompt.groups() if g), None) if prompt else None
    return int(limit.group(1)), tokens
