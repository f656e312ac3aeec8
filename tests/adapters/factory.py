"""Hand-made spans for adapter and algorithm tests: `Span` objects in the shapes the proxy and tracers write."""

from __future__ import annotations

import random
from typing import Any

from alight import semconv
from alight.store import Store
from alight.types import AttemptStatus, Rollout, Span, SpanKind, SpanStatus, Task


class Trace:
    """Builds the spans of one attempt in order; every span gets the next sequence id."""

    def __init__(self, rollout_id: str = "ro-1", attempt_id: str = "at-1") -> None:
        self.rollout_id, self.attempt_id = rollout_id, attempt_id
        self.spans: list[Span] = []
        self._seq = 0

    def _add(self, name: str, kind: SpanKind, attributes: dict[str, Any], **fields: Any) -> Span:
        self._seq += 1
        fields.setdefault("sequence_id", self._seq)
        fields.setdefault("start_time", 1000.0 + self._seq)
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            name=name,
            kind=kind,
            attributes=attributes,
            span_id=f"{self.rollout_id}-s{self._seq}",
            **fields,
        )
        self.spans.append(span)
        return span

    def llm(
        self,
        prompt: list[int] | None,
        response: list[int] | None,
        *,
        agent: str | None = "writer",
        logprobs: list[float] | bool | None = True,
        messages: list[dict[str, Any]] | None = None,
        reply: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Span:
        attributes: dict[str, Any] = {semconv.LLM_SOURCE: "proxy" if prompt is not None else "client"}
        if agent is not None:
            attributes[semconv.AGENT_NAME] = agent
        if prompt is not None:
            attributes[semconv.LLM_PROMPT_TOKEN_IDS] = prompt
        if response is not None:
            attributes[semconv.LLM_RESPONSE_TOKEN_IDS] = response
            if logprobs is True:
                attributes[semconv.LLM_RESPONSE_LOGPROBS] = [-0.5] * len(response)
            elif isinstance(logprobs, list):
                attributes[semconv.LLM_RESPONSE_LOGPROBS] = logprobs
        if messages is not None:
            attributes[semconv.LLM_REQUEST_MESSAGES] = messages
        if reply is not None:
            attributes[semconv.LLM_RESPONSE_MESSAGE] = reply
        return self._add("llm.chat", SpanKind.LLM, attributes, **fields)

    def tool(
        self,
        name: str,
        *,
        error: bool = False,
        exit_status: int | None = None,
        sql: str | None = None,
        agent: str | None = "writer",
        **fields: Any,
    ) -> Span:
        attributes: dict[str, Any] = {semconv.TOOL_NAME: name, semconv.TOOL_ERROR: error}
        if exit_status is not None:
            attributes[semconv.TOOL_EXIT_STATUS] = exit_status
        if sql is not None:
            attributes[semconv.TOOL_SQL] = sql
        if agent is not None:
            attributes[semconv.AGENT_NAME] = agent
        status = SpanStatus.ERROR if error else SpanStatus.OK
        return self._add(name, SpanKind.TOOL, attributes, status=status, **fields)

    def reward(self, value: float, name: str | None = None, **fields: Any) -> Span:
        attributes: dict[str, Any] = {semconv.REWARD_VALUE: value, semconv.REWARD_SOURCE: "agent"}
        if name is not None:
            attributes[semconv.REWARD_NAME] = name
        return self._add("reward", SpanKind.REWARD, attributes, **fields)

    def agent(self, name: str, **fields: Any) -> Span:
        return self._add(name, SpanKind.AGENT, {semconv.AGENT_NAME: name}, **fields)

    def dicts(self) -> list[dict[str, Any]]:
        """The spans as plain dicts in Span's JSON shape (what a bulk store read hands over)."""
        return [span.model_dump(mode="json") for span in self.spans]


# -- stores full of varied rollouts (columnar path tests) ----------------------------------------

AGENTS = ("writer", "checker", "critic", None)
#: What a rollout may hold that LightningRL's columnar path leaves to the object path.
SLOW = ("client_call", "no_logprobs", "mid_reward", "parent_agent", "same_seq", "empty_response")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000) for _ in range(n)]


def _trace(rng: random.Random, rollout_id: str, attempt_id: str, slow: str | None) -> Trace:
    t = Trace(rollout_id, attempt_id)
    root = t.agent("root")
    for _ in range(rng.randint(0, 5)):
        agent = rng.choice(AGENTS)
        t.llm(_ids(rng, rng.randint(1, 12)), _ids(rng, rng.randint(1, 7)), agent=agent)
        if rng.random() < 0.3:
            t.tool("run_sql", error=rng.random() < 0.5, sql="SELECT 1")
    if slow == "client_call":
        t.llm(None, None, messages=[{"role": "user", "content": "hi"}])
    elif slow == "no_logprobs":
        t.llm([1, 2], [3], logprobs=None)
    elif slow == "mid_reward":
        t.reward(0.5)
        t.llm([4, 5, 6], [7, 8])
    elif slow == "parent_agent":
        t.llm([1, 2, 3], [4], agent=None, parent_id=root.span_id)
    elif slow == "same_seq":
        t.llm([1, 2, 3], [4, 5], sequence_id=t._seq)
    elif slow == "empty_response":
        t.llm([1, 2], [])
    roll = rng.random()
    if roll < 0.5:
        t.reward(rng.choice([0.0, 1.0, 0.25]), "final")
    elif roll < 0.7:
        t.reward(rng.choice([0.0, 1.0, -0.5]))  # the episode's own reward, not named "final"
    return t


async def fill_store(store: Store, seed: int, n: int) -> list[str]:
    """`n` rollouts in groups of 1 to 4 (some without a group), each finished or never claimed."""
    rng = random.Random(seed)
    ids: list[str] = []
    group, unclaimed = 0, []
    while len(ids) < n:
        size, group = rng.randint(1, 4), group + 1
        for _ in range(size):
            rollout = Rollout(task=Task(input={"q": group}), group_id=None if rng.random() < 0.1 else f"g{group}")
            ids.append(rollout.rollout_id)
            if rng.random() < 0.05:
                unclaimed.append(rollout)  # never claimed: no attempt, no spans
                continue
            await store.enqueue([rollout])
            claim = await store.dequeue("w0")
            assert claim is not None and claim.rollout.rollout_id == rollout.rollout_id
            slow = rng.choice(SLOW) if rng.random() < 0.2 else None
            await store.add_spans(_trace(rng, rollout.rollout_id, claim.attempt.attempt_id, slow).spans)
            reward = None if rng.random() < 0.3 else rng.choice([0.0, 1.0, 0.5, 0.1])
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=reward)
    await store.enqueue(unclaimed)
    return ids
