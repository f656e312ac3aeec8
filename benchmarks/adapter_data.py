"""A SQLite store full of finished rollouts whose spans look like the ones a real run writes: LLM
spans as the proxy records them (messages, prompt ids, response ids and log-probs, three agents),
an agent span, a tool span and the final reward span per rollout. Used by adapter_bench.py."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path

from alight import semconv
from alight.store.sqlite import SqliteStore
from alight.store.sqlite_schema import insert_spans, span_row
from alight.types import Attempt, AttemptStatus, Rollout, RolloutStatus, Span, SpanKind, SpanStatus, Task

AGENTS = ("writer", "checker", "rewriter")
WORDS = ("the", "a", "model", "answer", "check", "tool", "value", "list", "query", "table", "city", "river", "plan")


def _text(rng: random.Random, n_chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_chars:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)


class _Context:
    """One agent's side of the conversation: its messages and the token ids the engine saw so far."""

    def __init__(self, rng: random.Random, agent: str) -> None:
        self.messages: list[dict[str, str]] = [{"role": "system", "content": f"You are the {agent}. " + _text(rng, 80)}]
        self.ids: list[int] = []


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(151_000) for _ in range(n)]


def _llm_span(rng: random.Random, ro: Rollout, at: Attempt, seq: int, agent: str, context: _Context) -> Span:
    """The agent's next call: its prompt extends its previous prompt + response (a multi-turn agent)."""
    first = not context.ids
    n_new = rng.randint(100, 150) if first else rng.randint(40, 80)
    n_response = rng.randint(30, 60)
    # About 4 characters a token: the messages are as long as the prompt ids say.
    messages = [*context.messages, {"role": "user", "content": _text(rng, 4 * n_new)}]
    reply = {"role": "assistant", "content": _text(rng, 4 * n_response)}
    prompt_ids = context.ids + _ids(rng, n_new)
    response_ids = _ids(rng, n_response)
    context.messages = [*messages, reply]
    context.ids = prompt_ids + response_ids
    start = ro.created_at + seq
    return Span(
        rollout_id=ro.rollout_id,
        attempt_id=at.attempt_id,
        sequence_id=seq,
        name="llm.chat",
        kind=SpanKind.LLM,
        start_time=start,
        end_time=start + 0.5,
        status=SpanStatus.OK,
        attributes={
            semconv.LLM_SOURCE: "proxy",
            semconv.LLM_API: "chat",
            semconv.LLM_REQUEST_MODEL: "policy",
            semconv.LLM_REQUEST_SAMPLING: {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
            semconv.LLM_STREAM: False,
            semconv.LLM_LATENCY_S: 0.5,
            semconv.RESOURCES_VERSION: 1,
            semconv.LLM_REQUEST_MESSAGES: messages,
            semconv.AGENT_NAME: agent,
            semconv.LLM_RESPONSE_MESSAGE: reply,
            semconv.LLM_FINISH_REASON: "stop",
            semconv.LLM_RESPONSE_MODEL: "policy",
            semconv.LLM_PROMPT_TOKEN_IDS: prompt_ids,
            semconv.LLM_RESPONSE_TOKEN_IDS: response_ids,
            semconv.LLM_RESPONSE_LOGPROBS: [-rng.expovariate(2.0) for _ in range(n_response)],
            semconv.LLM_TOKEN_IDS_SOURCE: "engine",
            semconv.LLM_USAGE: {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": n_response,
                "total_tokens": len(prompt_ids) + n_response,
            },
        },
    )


def call_agents(calls: int) -> list[str]:
    """Who makes each call: the writer first, then the checker and the rewriter in turn."""
    return [AGENTS[0] if i == 0 else AGENTS[1 + (i + 1) % 2] for i in range(calls)]


def _rollout_rows(rng: random.Random, index: int, group_size: int, calls: int) -> tuple[Rollout, Attempt, list[Span]]:
    reward = float(rng.random() < 0.5)
    ro = Rollout(
        task=Task(task_id=f"task-{index // group_size}", input={"question": _text(rng, 80)}),
        group_id=f"group-{index // group_size}",
        status=RolloutStatus.SUCCEEDED,
        attempt_count=1,
        reward=reward,
        created_at=1.7e9 + index,
        started_at=1.7e9 + index,
        ended_at=1.7e9 + index + calls + 2,
    )
    at = Attempt(
        rollout_id=ro.rollout_id,
        number=1,
        status=AttemptStatus.SUCCEEDED,
        worker_id="w0",
        claimed_at=ro.created_at,
        started_at=ro.created_at,
        last_heartbeat_at=ro.created_at,
        ended_at=ro.ended_at,
    )
    root = Span(rollout_id=ro.rollout_id, attempt_id=at.attempt_id, sequence_id=0, name="agent", kind=SpanKind.AGENT)
    root.attributes[semconv.AGENT_NAME] = "agent"
    spans = [root]
    contexts = {agent: _Context(rng, agent) for agent in AGENTS}
    for call, agent in enumerate(call_agents(calls)):
        spans.append(_llm_span(rng, ro, at, len(spans), agent, contexts[agent]))
        if call == 1:  # the checker runs a tool after its first call
            tool = Span(rollout_id=ro.rollout_id, attempt_id=at.attempt_id, sequence_id=len(spans), name="lint")
            tool.kind = SpanKind.TOOL
            tool.attributes = {semconv.TOOL_NAME: "lint", semconv.TOOL_OUTPUT: "ok", semconv.AGENT_NAME: "checker"}
            spans.append(tool)
    final = Span(rollout_id=ro.rollout_id, attempt_id=at.attempt_id, sequence_id=len(spans), name="reward")
    final.kind = SpanKind.REWARD
    final.attributes = {semconv.REWARD_VALUE: reward, semconv.REWARD_NAME: "final", semconv.REWARD_SOURCE: "agent"}
    spans.append(final)
    return ro, at, spans


def populate(path: Path, *, rollouts: int, group_size: int, calls: int, seed: int = 0) -> list[str]:
    """Write `rollouts` finished rollouts (groups of `group_size`, `calls` LLM calls each) straight
    into a new SQLite store at `path`, rows as `SqliteStore.add_spans` writes them; returns their ids in order."""
    asyncio.run(SqliteStore(path).close())  # creates the file and its schema
    rng = random.Random(seed)
    ids: list[str] = []
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    for index in range(rollouts):
        ro, at, spans = _rollout_rows(rng, index, group_size, calls)
        ids.append(ro.rollout_id)
        db.execute(
            "INSERT INTO rollouts (rollout_id, status, mode, group_id, data) VALUES (?, ?, ?, ?, ?)",
            (ro.rollout_id, ro.status.value, ro.mode.value, ro.group_id, ro.model_dump_json()),
        )
        db.execute(
            "INSERT INTO attempts (attempt_id, rollout_id, number, status, data) VALUES (?, ?, ?, ?, ?)",
            (at.attempt_id, ro.rollout_id, at.number, at.status.value, at.model_dump_json()),
        )
        insert_spans(db, [span_row(s, s.sequence_id or 0) for s in spans])
    db.execute("COMMIT")
    db.close()
    return ids


def stored_bytes(path: Path) -> int:
    """Total size of the stored spans: JSON and binary ids."""
    db = sqlite3.connect(path)
    try:
        sizes = "LENGTH(data) + IFNULL(LENGTH(prompt_ids), 0) + IFNULL(LENGTH(response_ids), 0)"
        return int(db.execute(f"SELECT SUM({sizes} + IFNULL(LENGTH(response_logprobs), 0)) FROM spans").fetchone()[0])
    finally:
        db.close()
