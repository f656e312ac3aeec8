"""Scripts for the scripted OpenAI-compatible server (tests.fixtures.openai_server, a test fixture
standing in for a model) that drive the Spider agent (recipes/spider/agent.py) down known paths.

Each question gets a `Plan`: what the writer, the checker and the rewriter answer. The request's
system prompt says which of the three is asking, its `Question:` line which task it is. Four kinds:

- correct: the writer answers the gold SQL, the checker accepts it             -> reward 1
- wrong:   the writer's SQL runs but returns other rows, the checker accepts it -> reward 0
- broken:  the writer's and the rewriter's SQL both fail to run                  -> reward 0
- fixed:   the writer's SQL fails, the rewriter answers the gold SQL             -> reward 1
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint
from tests.fixtures.openai_server import Script, answer

AGENT = Path(__file__).resolve().parents[2] / "recipes" / "spider" / "agent.py"
WRITE_PROMPT, CHECK_PROMPT, REWRITE_PROMPT = (
    resolve_entrypoint(f"{AGENT}:{name}") for name in ("WRITE_PROMPT", "CHECK_PROMPT", "REWRITE_PROMPT")
)
KINDS = ("correct", "wrong", "broken", "fixed")


@dataclass(frozen=True)
class Plan:
    write: str  # the writer's reply
    check: str  # the checker's reply
    rewrite: str  # the rewriter's reply


@dataclass(frozen=True)
class Expected:
    """What a max_turns=2 run of one kind records, with the AIR rule sql_succeeds 0.1 / sql_fails -0.1."""

    reward: float
    llm_agents: tuple[str, ...]  # agent names of the LLM spans, in order
    tool_errors: tuple[bool, ...]  # per run_sql span: did it fail
    air: tuple[float, ...]  # AIR reward per run_sql span
    trained: tuple[tuple[str, float], ...]  # (agent, attached AIR reward) per kept transition


EXPECTED = {
    "correct": Expected(1.0, ("write_query", "check_query"), (False,), (0.1,), (("write_query", 0.1),)),
    "wrong": Expected(0.0, ("write_query", "check_query"), (False,), (0.1,), (("write_query", 0.1),)),
    "broken": Expected(
        0.0,
        ("write_query", "check_query", "rewrite_query"),
        (True, True),
        (-0.1, -0.1),
        (("write_query", -0.1), ("rewrite_query", -0.1)),
    ),
    "fixed": Expected(
        1.0,
        ("write_query", "check_query", "rewrite_query"),
        (True, False),
        (-0.1, 0.1),
        (("write_query", -0.1), ("rewrite_query", 0.1)),
    ),
}


def plan(kind: str, gold: str) -> Plan:
    """The replies that send a task with gold SQL `gold` down the path of `kind`."""
    if kind == "correct":
        return Plan(gold, "CORRECT", "unused")
    if kind == "wrong":
        return Plan("SELECT 'not the answer'", "CORRECT, it answers the question.", "unused")
    if kind == "broken":
        return Plan("SELEC name FRM nowhere", "It does not run.", "SELECT * FROM no_such_table")
    if kind == "fixed":
        return Plan("SELECT nothing FROM", "The query fails.", f"Fixed:\n```sql\n{gold}\n```")
    raise ValueError(kind)


def plans_for(tasks: Sequence[dict[str, Any]], kinds: Sequence[str]) -> dict[str, Plan]:
    """A plan per task question: the i-th task gets the i-th kind."""
    return {task["question"]: plan(kind, task["query"]) for task, kind in zip(tasks, kinds, strict=True)}


def spider_script(plans: dict[str, Plan]) -> Script:
    """A server script answering the writer, checker and rewriter of each planned question."""

    def script(request: dict[str, Any]) -> dict[str, Any]:
        system, user = request["messages"][0]["content"], request["messages"][1]["content"]
        found = re.search(r"^Question: (.*)$", user, re.MULTILINE)
        assert found is not None, user
        chosen = plans[found.group(1)]
        replies = {WRITE_PROMPT: chosen.write, CHECK_PROMPT: chosen.check, REWRITE_PROMPT: chosen.rewrite}
        return answer(replies[system])

    return script
