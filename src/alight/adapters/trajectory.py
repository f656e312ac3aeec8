"""Trajectory mode: an agent's successive calls merged into one multi-turn sequence with a response mask.

This is the alternative LightningRL is compared with: instead of one (prompt, response) sample per
call, a conversation becomes one sequence whose loss mask covers only the model's own tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from alight.adapters.calls import LLMCall


def merge_trajectories(calls: list[LLMCall]) -> tuple[list[LLMCall], int, int]:
    """Merge each agent's calls whose prompt extends its previous prompt + response exactly.

    Calls are taken in attempt order. A call of agent A is appended to A's open sequence when its
    prompt ids start with that sequence's full ids (first prompt + everything after it); the ids in
    between (tool results, user turns, the next generation prompt) join the response with mask 0
    and log-prob 0.0, the call's own response with mask 1. Calls of other agents in between do not
    break A's sequence. When the prompt does not extend it (the agent rewrote its context, or the
    template re-rendered earlier turns differently), the call starts a new sequence: a fallback.
    A merged sequence has log-probs only when every merged call had them, and carries the sum of
    their attached rewards. Returns (sequences in order of their first call, merges, fallbacks).
    Ids may be lists or numpy arrays: arrays are compared and joined with numpy, never per token.
    """
    out: list[LLMCall] = []
    open_by_agent: dict[str | None, _Open] = {}
    merges = fallbacks = 0
    for call in calls:
        current = open_by_agent.get(call.agent_name)
        if current is not None:
            last_prompt, last_response = current.last_prompt, current.last_response
            a, n = len(last_prompt), len(last_prompt) + len(last_response)
            prompt = call.prompt_ids
            if len(prompt) >= n and _equal(prompt[:a], last_prompt) and _equal(prompt[a:n], last_response):
                current.add(prompt[n:], call)
                merges += 1
                continue
            fallbacks += 1
            current.close()
        sequence = LLMCall(
            prompt_ids=call.prompt_ids,
            response_ids=call.response_ids,
            logprobs=call.logprobs,
            agent_name=call.agent_name,
            span_id=call.span_id,
            reward=call.reward,
            span_ids=[call.span_id],
        )
        out.append(sequence)
        open_by_agent[call.agent_name] = _Open(sequence, call)
    for current in open_by_agent.values():
        current.close()
    return out, merges, fallbacks


class _Open:
    """An agent's sequence being merged: its parts are joined once, when it is closed."""

    __slots__ = ("last_prompt", "last_response", "logprobs", "mask_runs", "responses", "sequence")

    def __init__(self, sequence: LLMCall, call: LLMCall) -> None:
        self.sequence = sequence
        self.last_prompt, self.last_response = call.prompt_ids, call.response_ids
        self.responses: list[Any] = [call.response_ids]
        self.mask_runs: list[tuple[int, int]] = [(1, len(call.response_ids))]  # (mask value, length)
        self.logprobs: list[Any] | None = None if call.logprobs is None else [call.logprobs]

    def add(self, inserted: Any, call: LLMCall) -> None:
        """Append the ids inserted since the last call (mask 0, log-prob 0.0) and `call`'s response."""
        self.responses += (inserted, call.response_ids)
        self.mask_runs += ((0, len(inserted)), (1, len(call.response_ids)))
        if self.logprobs is not None and call.logprobs is not None:
            self.logprobs += (_filled(0.0, len(inserted), call.logprobs), call.logprobs)
        else:
            self.logprobs = None
        self.sequence.reward += call.reward
        assert self.sequence.span_ids is not None
        self.sequence.span_ids.append(call.span_id)
        self.last_prompt, self.last_response = call.prompt_ids, call.response_ids

    def close(self) -> None:
        """Join the merged parts into the sequence's response ids, mask and log-probs."""
        sequence, first = self.sequence, self.responses[0]
        if len(self.responses) == 1:
            sequence.mask = _filled(1, len(first), first)
            return
        sequence.response_ids = _join(self.responses)
        if type(first) is list:
            sequence.mask = [value for value, length in self.mask_runs for _ in range(length)]
        else:
            values, lengths = zip(*self.mask_runs, strict=True)
            sequence.mask = np.repeat(np.array(values, dtype=np.asarray(first).dtype), lengths)
        sequence.logprobs = None if self.logprobs is None else _join(self.logprobs)


def _equal(x: Any, y: Any) -> bool:
    """Whether two id runs (lists or arrays) hold the same ids."""
    if type(x) is list and type(y) is list:
        return x == y
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype:
        return len(x) == len(y) and x.tobytes() == y.tobytes()
    return bool(np.array_equal(x, y))


def _join(parts: list[Any]) -> Any:
    """The parts one after another: a list when all are lists, else a numpy array."""
    if all(type(part) is list for part in parts):
        return [value for part in parts for value in part]
    return np.concatenate([np.asarray(part) for part in parts])


def _filled(value: float, n: int, like: Any) -> Any:
    """`n` copies of `value`, a list when `like` is one, else an array of its dtype."""
    return [value] * n if type(like) is list else np.full(n, value, dtype=np.asarray(like).dtype)
