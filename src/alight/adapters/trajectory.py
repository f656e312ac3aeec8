"""Trajectory mode: an agent's successive calls merged into one multi-turn sequence with a response mask.

This is the alternative LightningRL is compared with: instead of one (prompt, response) sample per
call, a conversation becomes one sequence whose loss mask covers only the model's own tokens.
"""

from __future__ import annotations

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
    """
    out: list[LLMCall] = []
    open_by_agent: dict[str | None, tuple[LLMCall, list[int]]] = {}  # agent -> (sequence, its full ids)
    merges = fallbacks = 0
    for call in calls:
        current = open_by_agent.get(call.agent_name)
        if current is not None:
            sequence, full = current
            n = len(full)
            if len(call.prompt_ids) >= n and call.prompt_ids[:n] == full:
                inserted = call.prompt_ids[n:]
                sequence.response_ids = sequence.response_ids + inserted + call.response_ids
                assert sequence.mask is not None and sequence.span_ids is not None
                sequence.mask = sequence.mask + [0] * len(inserted) + [1] * len(call.response_ids)
                if sequence.logprobs is not None and call.logprobs is not None:
                    sequence.logprobs = sequence.logprobs + [0.0] * len(inserted) + call.logprobs
                else:
                    sequence.logprobs = None
                sequence.reward += call.reward
                sequence.span_ids.append(call.span_id)
                open_by_agent[call.agent_name] = (sequence, call.prompt_ids + call.response_ids)
                merges += 1
                continue
            fallbacks += 1
        sequence = LLMCall(
            prompt_ids=call.prompt_ids,
            response_ids=call.response_ids,
            logprobs=call.logprobs,
            agent_name=call.agent_name,
            span_id=call.span_id,
            reward=call.reward,
            mask=[1] * len(call.response_ids),
            span_ids=[call.span_id],
        )
        out.append(sequence)
        open_by_agent[call.agent_name] = (sequence, call.prompt_ids + call.response_ids)
    return out, merges, fallbacks
