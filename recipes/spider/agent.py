"""A text-to-SQL agent as a LangGraph workflow with `langchain-openai`: the Spider recipe.

    write_query -> execute_query -> check_query -> rewrite_query -> execute_query -> ...

The writer turns the question and the database schema into one SQLite query; `execute_query`
runs it through the `run_sql` tool (read-only connection, a time limit); the checker reads the
question, the query and its result and answers CORRECT or says what is wrong; the rewriter writes
a corrected query from that. The loop ends when the checker accepts or `max_turns` queries have
been written (the last turn skips the checker: nothing would follow it). The reward is Spider's
execution accuracy: 1.0 when the final query's result equals the gold query's (as a multiset of
rows, in order when the gold query has an ORDER BY), else 0.0.

Training selects the writer's and rewriter's calls (`adapter.agent_match: write_query|rewrite_query`:
LangGraph node names become agent names); the checker is the same model but is not trained. The
agent takes nothing from alight but the decorator and the endpoint it is handed (`llm.base_url`,
`llm.model`, `llm.api_key`). Rows come from `recipes/spider/data.py`.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

import alight

# Prompts are short on purpose: with the tiny model's byte tokenizer every character is a token.
WRITE_PROMPT = "Write one SQLite query that answers the question. Reply with the SQL only."
CHECK_PROMPT = "Does the SQL answer the question? Reply CORRECT, or say what is wrong."
REWRITE_PROMPT = "The SQL is wrong. Write a corrected SQLite query. Reply with the SQL only."
ACCEPT = "CORRECT"  # the checker's reply starts with this when it accepts the query

MAX_ROWS = 100_000  # a result with more rows counts as failed (a runaway join)
SHOWN_ROWS = 5  # rows of a result shown to the checker and the rewriter
SHOWN_CHARS = 240  # longest result, error or feedback text put in a prompt
PROGRESS_STEPS = 1_000  # SQLite virtual-machine steps between two time-limit checks

_CODE_BLOCK = re.compile(r"```(?:sqlite|sql)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


# -- SQL execution and Spider's execution accuracy ------------------------------------------------


def execute_sql(db_path: str, sql: str, time_limit_s: float = 2.0) -> list[tuple[Any, ...]]:
    """The rows `sql` returns on the database at `db_path`, opened read-only.

    The connection is read-only (`mode=ro` URI, `query_only`, no ATTACH), so no query can change
    or create a file; a query running longer than `time_limit_s` is interrupted. Raises
    sqlite3.Error (a bad query, an interrupted one, more than MAX_ROWS rows)."""
    if not sql.strip().strip(";").strip():
        raise sqlite3.OperationalError("empty query")
    if not Path(db_path).is_file():  # mode=ro would say only "unable to open database file"
        raise sqlite3.OperationalError(f"no database file {db_path}")
    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.execute("PRAGMA query_only = ON")
        deadline = time.monotonic() + time_limit_s
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_STEPS)
        cursor = conn.execute(sql)
        rows: list[tuple[Any, ...]] = []
        while batch := cursor.fetchmany(1000):
            rows.extend(batch)
            if len(rows) > MAX_ROWS:
                raise sqlite3.OperationalError(f"the result has more than {MAX_ROWS} rows")
        return rows
    finally:
        conn.close()


def results_match(predicted: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool) -> bool:
    """Spider's execution match: the same rows, in the same order when `ordered`, else as multisets
    (duplicates count). Values compare as Python values (1 == 1.0); column order matters."""
    predicted, gold = [tuple(r) for r in predicted], [tuple(r) for r in gold]
    return predicted == gold if ordered else Counter(predicted) == Counter(gold)


def execution_accuracy(db_path: str, predicted_sql: str | None, gold_sql: str, time_limit_s: float = 2.0) -> float:
    """1.0 when `predicted_sql` returns what `gold_sql` returns (ordered iff the gold query has
    ORDER BY), else 0.0; a missing or failing prediction scores 0.0."""
    if not predicted_sql:
        return 0.0
    try:
        predicted = execute_sql(db_path, predicted_sql, time_limit_s)
    except (sqlite3.Error, sqlite3.Warning, ValueError):
        return 0.0
    gold = execute_sql(db_path, gold_sql, time_limit_s)
    return 1.0 if results_match(predicted, gold, ordered=_ORDER_BY.search(gold_sql) is not None) else 0.0


def extract_sql(text: str) -> str:
    """The SQL in a model reply: the first ```sql block, else the whole reply, trimmed."""
    block = _CODE_BLOCK.search(text)
    return (block.group(1) if block else text).strip()


def show_result(rows: list[tuple[Any, ...]]) -> str:
    """A result as prompt text: its first SHOWN_ROWS rows and the row count, cut to SHOWN_CHARS."""
    text = "; ".join(", ".join(str(v) for v in row) for row in rows[:SHOWN_ROWS])
    more = f" ({len(rows)} rows)" if len(rows) > SHOWN_ROWS else ""
    return (text or "no rows")[:SHOWN_CHARS] + more


# -- the agent --------------------------------------------------------------------------------------


class State(TypedDict):
    """What the graph's nodes pass on (at module level: LangGraph resolves the annotations)."""

    sql: str  # the latest query written
    result: str  # its rows or its error, as prompt text
    feedback: str  # the checker's last reply
    turns: int  # queries written so far
    accepted: bool  # the checker accepted the latest query


@alight.rollout
async def sql_agent(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]` on `task["db_path"]` with SQL; reward: execution accuracy of the
    final query against `task["query"]`."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    db_path, question, schema = task["db_path"], task["question"], task["schema"]
    max_turns, time_limit_s = int(task.get("max_turns", 2)), float(task.get("time_limit_s", 2.0))

    @tool
    def run_sql(sql: str) -> str:
        """Run one SQLite query on the task's database and return its rows."""
        return show_result(execute_sql(db_path, sql, time_limit_s))

    model = ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key)  # type: ignore[arg-type]
    asked = f"{schema}\nQuestion: {question}"

    async def write_query(state: State) -> dict[str, Any]:
        reply = await model.ainvoke([SystemMessage(WRITE_PROMPT), HumanMessage(asked)])
        return {"sql": extract_sql(str(reply.content)), "turns": 1}

    async def execute_query(state: State) -> dict[str, Any]:
        try:
            result = await run_sql.ainvoke({"sql": state["sql"]})
        except Exception as err:  # the tool span records the failure; the model reads the message
            result = f"Error: {err}"
        return {"result": str(result)[: SHOWN_CHARS + 20]}

    async def check_query(state: State) -> dict[str, Any]:
        shown = f"{asked}\nSQL: {state['sql']}\nResult: {state['result']}"
        reply = str((await model.ainvoke([SystemMessage(CHECK_PROMPT), HumanMessage(shown)])).content)
        return {"accepted": reply.strip().upper().startswith(ACCEPT), "feedback": reply.strip()[:SHOWN_CHARS]}

    async def rewrite_query(state: State) -> dict[str, Any]:
        shown = f"{asked}\nSQL: {state['sql']}\nResult: {state['result']}\nFeedback: {state['feedback']}"
        reply = await model.ainvoke([SystemMessage(REWRITE_PROMPT), HumanMessage(shown)])
        return {"sql": extract_sql(str(reply.content)), "turns": state["turns"] + 1}

    def after_execute(state: State) -> str:
        return END if state["turns"] >= max_turns else "check_query"

    def after_check(state: State) -> str:
        return END if state["accepted"] else "rewrite_query"

    graph = StateGraph(State)
    graph.add_node("write_query", write_query)
    graph.add_node("execute_query", execute_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_conditional_edges("execute_query", after_execute, ["check_query", END])
    graph.add_conditional_edges("check_query", after_check, ["rewrite_query", END])
    graph.add_edge("rewrite_query", "execute_query")
    start: State = {"sql": "", "result": "", "feedback": "", "turns": 0, "accepted": False}
    try:
        final = await graph.compile().ainvoke(start, {"recursion_limit": 4 * max_turns + 4})
    finally:
        await model.root_async_client.close()  # type: ignore[union-attr]
    return execution_accuracy(db_path, final["sql"], task["query"], time_limit_s)
