"""One kept LLM call on its way to a transition, and the length limits applied to it."""

from __future__ import annotations

from dataclasses import dataclass

from alight.types import LogProbs, TokenIds


@dataclass(slots=True)
class LLMCall:
    """A kept LLM call (or, in trajectory mode, an agent's merged calls) before it becomes a transition."""

    prompt_ids: TokenIds  # a list, or a numpy array read from the store (never changed in place)
    response_ids: TokenIds
    logprobs: LogProbs | None  # one per response token, or None
    agent_name: str | None
    span_id: str | None
    reward: float = 0.0  # intermediate rewards attached to the call (mid-episode reward spans, AIR)
    mask: TokenIds | None = None  # trajectory mode: 1 on generated response tokens, 0 on inserted ones
    span_ids: list[str | None] | None = None  # trajectory mode: the merged calls' spans, in order


def truncate_call(call: LLMCall, max_prompt_length: int | None, max_response_length: int | None) -> tuple[int, int]:
    """Cut `call` to the limits in place; returns (prompt tokens cut, response tokens cut).

    The prompt keeps its LAST `max_prompt_length` ids (the generation prompt and the latest turns
    stay next to the response), the response its FIRST `max_response_length` ids, with its
    log-probs and mask cut alike (slices: an array's are views). Limits apply to ids, so no token
    is ever split; what is kept is a contiguous run of the original ids. Rewards are untouched.
    """
    prompt_cut = response_cut = 0
    if max_prompt_length is not None and len(call.prompt_ids) > max_prompt_length:
        prompt_cut = len(call.prompt_ids) - max_prompt_length
        call.prompt_ids = call.prompt_ids[prompt_cut:]
    if max_response_length is not None and len(call.response_ids) > max_response_length:
        response_cut = len(call.response_ids) - max_response_length
        call.response_ids = call.response_ids[:max_response_length]
        if call.logprobs is not None:
            call.logprobs = call.logprobs[:max_response_length]
        if call.mask is not None:
            call.mask = call.mask[:max_response_length]
    return prompt_cut, response_cut
