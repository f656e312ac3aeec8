"""Token ids rebuilt from an LLM span's messages, for calls recorded without them (client-side spans).

The prompt ids are the chat template's text with the generation prompt, as the embedded engine and
the proxy render it; the response ids are what the template puts after it for the assistant
message, through its end-of-turn token (without it when the answer was cut by length). Log-probs
cannot be rebuilt: such transitions carry none and the backend recomputes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from alight import semconv
from alight.chat_template import ChatTokenizer, render_prompt, render_reply
from alight.errors import AlightError

logger = logging.getLogger(__name__)

#: A tokenizer callable: (messages, tools, response message) -> (prompt ids, response ids), or None.
TokenizeFn = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]], tuple[list[int], list[int]]]
#: What ids are rebuilt with: a tokenizer with a chat template (a Hugging Face tokenizer fits), or a `TokenizeFn`.
Retokenizer = ChatTokenizer | TokenizeFn


def retokenize(tokenizer: Retokenizer, attributes: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
    """(prompt ids, response ids) of an LLM span rebuilt with `tokenizer`, or None if it cannot be done.

    `tokenizer` is a tokenizer with a chat template (`alight.chat_template.ChatTokenizer`, such as a
    Hugging Face tokenizer), or a `TokenizeFn`. Chat spans
    need LLM_REQUEST_MESSAGES and LLM_RESPONSE_MESSAGE; completion spans LLM_REQUEST_PROMPT and
    LLM_RESPONSE_TEXT (encoded as they are).
    """
    messages = attributes.get(semconv.LLM_REQUEST_MESSAGES)
    tools = attributes.get(semconv.LLM_REQUEST_TOOLS) or None
    reply = attributes.get(semconv.LLM_RESPONSE_MESSAGE)
    try:
        if not isinstance(tokenizer, ChatTokenizer):
            if not isinstance(messages, list) or not isinstance(reply, dict):
                return None
            prompt_ids, response_ids = tokenizer(messages, tools, reply)
            return list(prompt_ids), list(response_ids)
        if isinstance(messages, list) and isinstance(reply, dict):
            return _chat_ids(tokenizer, messages, tools, reply, attributes.get(semconv.LLM_FINISH_REASON))
        prompt, text = attributes.get(semconv.LLM_REQUEST_PROMPT), attributes.get(semconv.LLM_RESPONSE_TEXT)
        if isinstance(prompt, str) and isinstance(text, str):
            return list(tokenizer.encode(prompt)), list(tokenizer.encode(text, add_special_tokens=False))
    except (AlightError, ValueError, TypeError, KeyError) as err:
        logger.warning("cannot re-tokenize an LLM call: %s", err)
    return None


def _chat_ids(
    tokenizer: ChatTokenizer, messages: list[Any], tools: Any, reply: dict[str, Any], finish_reason: Any
) -> tuple[list[int], list[int]]:
    prompt = render_prompt(tokenizer, messages, tools)
    reply_ids = list(tokenizer.encode(render_reply(tokenizer, messages, tools, reply), add_special_tokens=False))
    ends = [i for i, token in enumerate(reply_ids) if token in _end_ids(tokenizer)]
    if ends:  # the template adds text after the end-of-turn token (a newline) that the model never generated
        reply_ids = reply_ids[: ends[-1] + (0 if finish_reason == "length" else 1)]
    return list(tokenizer.encode(prompt, add_special_tokens=False)), reply_ids


def _end_ids(tokenizer: ChatTokenizer) -> set[int]:
    ends = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ends.add(im_end)
    return {i for i in ends if isinstance(i, int)}
