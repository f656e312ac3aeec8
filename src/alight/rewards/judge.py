"""reward.kind=judge: an LLM judge scores each attempt with a rubric; reward = score / max_score.

    reward:
      kind: judge
      judge:
        model: policy            # or a LiteLLM model string, e.g. openai/gpt-4o-mini (base_url, api_key_env)
        rubric: "Is this a correct answer to {task}? Answer: {answer}"
        max_score: 10

`JudgedAgent` wraps any agent (a Python entrypoint or a command): it runs the agent's rollout, then,
in the same attempt, asks the judge and returns its reward, which replaces what the agent returned
(or emitted last); rewards the agent emits on the way stay intermediate rewards. The answer judged
is the attempt's final assistant message: the text of the last LLM call the proxy recorded for the
attempt (for a command agent too, whatever it prints). The task is `task[task_field]`, or the task
(JSON unless it is a string).

The judge's calls are recorded as LLM spans of the agent `alight.judge` (semconv.JUDGE_AGENT),
which the adapter never trains on: with `model: policy` they go through the attempt's proxy route
(token ids and all), otherwise to the LiteLLM model, recorded by the runner's tracer. A malformed
answer (no score, out of range, not finite) or a failed judge call fails the attempt with a
one-line reason. Scores are cached by input hash (`alight.rewards.judge_cache`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from alight import semconv
from alight.agent import LLM, AgentFailure, LitAgent, load_agent
from alight.config.schema import JudgeConfig
from alight.errors import AlightError, one_line
from alight.rewards.judge_cache import JudgeCache, judgement_key
from alight.rewards.judge_score import JudgeAnswerError, judge_messages, parse_score, task_text
from alight.tracing import agent_scope, current_attempt
from alight.tracing.context import set_frame
from alight.types import Attempt, Rollout, Span, SpanKind, SpanStatus

if TYPE_CHECKING:
    from alight.engines.base import Engine

logger = logging.getLogger(__name__)

#: The judge's model setting that means "the policy's own engine, through the proxy".
POLICY = "policy"
#: How long to wait for the proxy to store the attempt's last LLM span (it writes them in the background).
SETTLE_S = 5.0
_SETTLE_POLL_S = 0.1
JUDGE = semconv.JUDGE_AGENT
#: Wall-clock limit of one judge call.
JUDGE_CALL_TIMEOUT_S = 300.0
T = TypeVar("T")


class JudgedAgent(LitAgent):
    """`agent` (an entrypoint string or a LitAgent) whose reward an LLM judge gives; see the module
    docstring. Picklable: an entrypoint travels as its string, the cache as its path."""

    def __init__(self, agent: str | LitAgent, judge: JudgeConfig, *, cache_path: Path | None = None) -> None:
        self.agent = agent
        self.name = agent.name if isinstance(agent, LitAgent) else load_agent(agent).name
        self.judge = JudgeConfig(**{key: getattr(judge, key) for key in JudgeConfig.__dataclass_fields__})
        self.cache = JudgeCache(cache_path) if judge.cache else None
        self._loaded: LitAgent | None = agent if isinstance(agent, LitAgent) else None
        self._engine: Engine | None = None

    def __repr__(self) -> str:
        return f"JudgedAgent({self.agent!r}, model={self.judge.model!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None
        if not isinstance(self.agent, LitAgent):
            state["_loaded"] = None
        return state

    async def run(
        self, task: Any, resources: Mapping[str, Any], rollout: Rollout, attempt: Attempt | None = None
    ) -> float | None:
        """Run the agent, then return the judge's reward for its final answer (the agent's own is replaced)."""
        if self._loaded is None:
            self._loaded = load_agent(str(self.agent))
        await self._loaded.run(task, resources, rollout, attempt)
        llm = resources.get("llm")
        if not isinstance(llm, LLM):
            llm = next((value for value in resources.values() if isinstance(value, LLM)), None)
        attempt_id = attempt.attempt_id if attempt is not None else None
        try:
            answer = await final_answer(rollout.rollout_id, attempt_id)
            return await self.score(task_text(task, self.judge.task_field), answer, llm, rollout.resources_version)
        except JudgeAnswerError as err:
            raise AgentFailure(str(err)) from None

    async def score(self, task: str, answer: str, llm: LLM | None, version: int | None = None) -> float:
        """The reward (score / max_score) the judge gives `answer` to `task`; cached by input hash."""
        judge = self.judge
        messages = judge_messages(judge, task, answer)
        policy = judge.model == POLICY
        key = judgement_key(
            model=judge.model if not policy else [POLICY, llm.model if llm else None, version],
            base_url=None if policy else judge.base_url,
            messages=messages,
            temperature=judge.temperature,
            max_tokens=judge.max_tokens,
            max_score=judge.max_score,
        )
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None:
            return cached / judge.max_score
        with agent_scope(semconv.JUDGE_AGENT):
            text = await (self._ask_policy(messages, llm) if policy else self._ask_model(messages))
        score = parse_score(text, judge.max_score)
        if self.cache is not None:
            self.cache.put(key, score)
        return score / judge.max_score

    async def _ask_policy(self, messages: list[dict[str, str]], llm: LLM | None) -> str | None:
        """One chat call to the policy through the attempt's proxy route, as the judge agent."""
        import httpx

        if llm is None:
            raise AgentFailure("judge: reward.judge.model=policy needs the policy's `llm` resource")
        body = {
            "model": llm.model,
            "messages": messages,
            "temperature": self.judge.temperature,
            "max_tokens": self.judge.max_tokens,
        }
        headers = {"Authorization": f"Bearer {llm.api_key}", semconv.HEADER_AGENT_NAME: semconv.JUDGE_AGENT}
        try:
            async with httpx.AsyncClient(timeout=JUDGE_CALL_TIMEOUT_S, trust_env=False) as client:
                response = await client.post(f"{llm.base_url.rstrip('/')}/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as err:
            raise AgentFailure(f"judge: the policy call failed: {one_line(err, 300)}") from None
        if response.status_code != 200:
            raise AgentFailure(f"judge: the policy call failed: HTTP {response.status_code} {response.text[:300]}")
        try:
            content = response.json()["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise AgentFailure(f"judge: the policy's answer is not a chat completion: {response.text[:200]}") from None
        return content if isinstance(content, str) or content is None else str(content)

    async def _ask_model(self, messages: list[dict[str, str]]) -> str | None:
        """One chat call to the LiteLLM judge model, recorded as an LLM span of the judge agent."""
        from alight.engines.base import ChatRequest, SamplingParams
        from alight.engines.litellm_engine import LiteLLMEngine

        judge = self.judge
        if self._engine is None:
            self._engine = LiteLLMEngine(
                judge.model, base_url=judge.base_url, api_key_env=judge.api_key_env, return_token_ids=False
            )
        sampling = SamplingParams(temperature=judge.temperature, max_tokens=judge.max_tokens, logprobs=False)
        request = ChatRequest(model=judge.model, messages=list(messages), sampling=sampling, agent=semconv.JUDGE_AGENT)
        context = current_attempt()
        attributes: dict[str, Any] = {
            semconv.LLM_SOURCE: "client",
            semconv.LLM_API: "chat",
            semconv.LLM_REQUEST_MODEL: judge.model,
            semconv.LLM_REQUEST_MESSAGES: request.messages,
            semconv.LLM_REQUEST_SAMPLING: {"temperature": judge.temperature, "max_tokens": judge.max_tokens},
            semconv.LLM_STREAM: False,
        }
        span = context.start_span("llm.chat", SpanKind.LLM, attributes) if context is not None else None
        started = time.perf_counter()
        try:
            generation = await asyncio.wait_for(_untraced(self._engine.chat(request)), JUDGE_CALL_TIMEOUT_S)
        except (AlightError, TimeoutError) as err:
            if span is not None:
                span.end(SpanStatus.ERROR, one_line(err, 300))
            raise AgentFailure(f"judge: the call to {judge.model} failed: {one_line(err, 300)}") from None
        if span is not None:
            attributes.update(
                {
                    semconv.LLM_RESPONSE_MESSAGE: generation.message,
                    semconv.LLM_FINISH_REASON: generation.finish_reason,
                    semconv.LLM_RESPONSE_MODEL: generation.model,
                    semconv.LLM_LATENCY_S: time.perf_counter() - started,
                }
            )
            span.end()
        content = (generation.message or {}).get("content")
        return content if isinstance(content, str) or content is None else str(content)


async def _untraced(call: Awaitable[T]) -> T:
    """Await `call` outside the attempt (in its own task's context): the SDK that LiteLLM uses is
    not traced, so the judge's span recorded here is the call's one record."""
    set_frame(None)
    return await call


async def final_answer(rollout_id: str, attempt_id: str | None) -> str:
    """The text of the attempt's last recorded assistant message (not the judge's), once the
    proxy's background writes have settled; JudgeAnswerError when the attempt has none."""
    context = current_attempt()
    if context is None or attempt_id is None:
        raise JudgeAnswerError("judge: the agent ran outside an attempt, so it has no recorded answer")
    with contextlib.suppress(Exception):
        await context.flush()
    deadline = time.monotonic() + SETTLE_S
    seen: tuple[int, str | None] | None = None
    while True:
        spans = await context.store.query_spans(rollout_id, attempt_id)
        calls = [s for s in spans if s.kind is SpanKind.LLM and s.attributes.get(semconv.AGENT_NAME) != JUDGE]
        calls.sort(key=_call_order)
        texts = [_message_text(s.attributes.get(semconv.LLM_RESPONSE_MESSAGE)) for s in calls]
        answer = next((text for text in reversed(texts) if text), None)
        now = (len(calls), answer)
        if (now == seen and answer is not None) or time.monotonic() >= deadline:
            break
        seen = now
        await asyncio.sleep(_SETTLE_POLL_S)
    if answer is None:
        raise JudgeAnswerError("judge: the attempt recorded no assistant message to judge")
    return answer


def _call_order(span: Span) -> tuple[float, float]:
    return (span.sequence_id if span.sequence_id is not None else float("inf")), span.start_time or 0.0


def _message_text(message: Any) -> str | None:
    """The text of an OpenAI assistant message (content as a string or a list of text parts)."""
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text") or "" for part in content if isinstance(part, Mapping))
    return content.strip() or None if isinstance(content, str) else None
