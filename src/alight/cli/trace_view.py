"""`alight trace`: read a run's store and show its rollouts, one rollout's span tree, or export them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from alight import semconv
from alight.errors import ConfigError
from alight.store.base import ALL_ATTEMPTS, Store
from alight.types import Attempt, Rollout, Span, SpanKind

STORE_FILE = "store.db"  # name of the SQLite store inside a run directory


def open_store(target: str) -> Store:
    """A store from a run directory, a SQLite file or a store server URL."""
    if target.startswith(("http://", "https://")):
        from alight.store.client import StoreClient

        return StoreClient(target, max_retries=1)
    path = Path(target).expanduser()
    if path.is_dir():
        path = path / STORE_FILE
    if not path.is_file():
        raise ConfigError(f"{target}: no run directory, store file or store URL there (looked for {path})")
    from alight.store.sqlite import SqliteStore

    return SqliteStore(path)


async def rollout_summaries(store: Store, limit: int, offset: int = 0) -> list[dict[str, Any]]:
    """One dict per rollout: ids, status, reward, attempts and span counts by kind."""
    rollouts = await store.list_rollouts(limit=limit, offset=offset)
    rows = []
    for rollout in rollouts:
        spans = await store.query_spans(rollout.rollout_id) if rollout.attempt_count else []
        counts = {kind.value: sum(1 for s in spans if s.kind == kind) for kind in SpanKind}
        ends = [s.end_time for s in spans if s.end_time] + [rollout.ended_at or 0]
        rows.append(
            {
                "rollout_id": rollout.rollout_id,
                "mode": rollout.mode.value,
                "status": rollout.status.value,
                "reward": rollout.reward,
                "attempts": rollout.attempt_count,
                "llm_calls": counts["llm"],
                "tool_calls": counts["tool"],
                "duration_s": (max(ends) - rollout.started_at) if rollout.started_at and max(ends) else None,
            }
        )
    return rows


async def rollout_detail(store: Store, rollout_id: str, all_attempts: bool) -> dict[str, Any]:
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.list_attempts(rollout_id)
    spans = await store.query_spans(rollout_id, ALL_ATTEMPTS if all_attempts else None)
    return {"rollout": rollout, "attempts": attempts, "spans": spans}


def print_summaries(console: Console, rows: Sequence[dict[str, Any]], where: str) -> None:
    table = Table(title=f"Rollouts in {where}", title_justify="left")
    for column in ("rollout", "mode", "status", "reward", "attempts", "LLM calls", "tool calls", "duration"):
        table.add_column(column, justify="right" if column not in ("rollout", "mode", "status") else "left")
    for row in rows:
        table.add_row(
            row["rollout_id"],
            row["mode"],
            Text(row["status"], style=_status_style(row["status"])),
            _fmt(row["reward"]),
            str(row["attempts"]),
            str(row["llm_calls"]),
            str(row["tool_calls"]),
            _seconds(row["duration_s"]),
        )
    console.print(table)
    if rows:
        console.print(f"[dim]alight trace {where} --rollout {rows[0]['rollout_id']}  shows one rollout's spans[/dim]")


def print_rollout(console: Console, rollout: Rollout, attempts: Sequence[Attempt], spans: Sequence[Span]) -> None:
    task = json.dumps(rollout.task.input, ensure_ascii=False, default=str)
    head = Tree(
        Text.assemble(
            (f"rollout {rollout.rollout_id}", "bold"),
            f"  {rollout.mode.value}  ",
            (rollout.status.value, _status_style(rollout.status.value)),
            f"  reward {_fmt(rollout.reward)}  task {_clip(task, 80)}",
        )
    )
    by_attempt: dict[str, list[Span]] = {}
    for span in spans:
        by_attempt.setdefault(span.attempt_id, []).append(span)
    for attempt in attempts:
        if attempt.attempt_id not in by_attempt and attempt is not attempts[-1]:
            continue
        node = head.add(
            Text.assemble(
                (f"attempt {attempt.number}", "bold"),
                f" {attempt.attempt_id}  ",
                (attempt.status.value, _status_style(attempt.status.value)),
                f"  worker {attempt.worker_id or '-'}",
            )
        )
        if attempt.error:
            node.add(Text(_clip(attempt.error.strip().splitlines()[-1], 160), style="red"))
        _add_span_tree(node, by_attempt.get(attempt.attempt_id, []))
    console.print(head)


def _add_span_tree(node: Tree, spans: Sequence[Span]) -> None:
    ids = {span.span_id for span in spans}
    children: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)

    def add(parent_node: Tree, parent_id: str | None) -> None:
        for span in children.get(parent_id, []):
            add(parent_node.add(span_label(span)), span.span_id)

    add(node, None)


def span_label(span: Span) -> Text:
    """One line per span: kind, name, agent, timing and what matters for its kind."""
    a = span.attributes
    label = Text.assemble((f"{span.kind.value:<6}", _KIND_STYLE.get(span.kind, "")), " ", (span.name, "bold"))
    agent = a.get(semconv.AGENT_NAME)
    if agent:
        label.append(f"  [{agent}]", style="cyan")
    if span.end_time is not None:
        label.append(f"  {_seconds(span.end_time - span.start_time)}", style="dim")
    label.append("  " + _details(span))
    if span.status.value == "error":
        label.append(f"  error: {_clip(span.status_message or '', 100)}", style="red")
    return label


def _details(span: Span) -> str:
    a = span.attributes
    if span.kind == SpanKind.LLM:
        usage = a.get(semconv.LLM_USAGE) or {}
        message = a.get(semconv.LLM_RESPONSE_MESSAGE) or {}
        calls = [c.get("function", {}).get("name", "?") for c in message.get("tool_calls") or []]
        parts = [
            f"{usage.get('prompt_tokens', '?')}->{usage.get('completion_tokens', '?')} tokens",
            f"finish {a.get(semconv.LLM_FINISH_REASON, '?')}",
            f"ids {a.get(semconv.LLM_TOKEN_IDS_SOURCE, 'none')}",
        ]
        if a.get(semconv.RESOURCES_VERSION) is not None:
            parts.append(f"v{a[semconv.RESOURCES_VERSION]}")
        if calls:
            parts.append("calls " + ", ".join(calls))
        elif message.get("content"):
            parts.append(repr(_clip(str(message["content"]), 60)))
        return "  ".join(parts)
    if span.kind == SpanKind.TOOL:
        args = a.get(semconv.TOOL_ARGUMENTS)
        out = a.get(semconv.TOOL_OUTPUT)
        args_text = args if isinstance(args, str) else json.dumps(args, default=str)
        return f"{_clip(str(args_text), 50)} -> {_clip(str(out), 50)}" + (
            "  (tool error)" if a.get(semconv.TOOL_ERROR) else ""
        )
    if span.kind == SpanKind.REWARD:
        name = a.get(semconv.REWARD_NAME)
        return f"{_fmt(a.get(semconv.REWARD_VALUE))}" + (f" ({name})" if name else "")
    if span.name == "exception":
        return f"{a.get(semconv.EXCEPTION_TYPE, '')}: {_clip(str(a.get(semconv.EXCEPTION_MESSAGE, '')), 80)}"
    return ""


_KIND_STYLE = {
    SpanKind.LLM: "magenta",
    SpanKind.TOOL: "yellow",
    SpanKind.REWARD: "green",
    SpanKind.AGENT: "cyan",
}


def _status_style(status: str) -> str:
    return {"succeeded": "green", "failed": "red", "timeout": "red", "cancelled": "yellow"}.get(status, "blue")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def run_trace(
    target: str,
    *,
    rollout_id: str | None,
    as_json: bool,
    otlp_path: Path | None,
    all_attempts: bool,
    limit: int,
    console: Console,
) -> None:
    """The body of `alight trace`."""
    import asyncio

    from alight.store.otlp_export import spans_to_otlp_json

    async def main() -> None:
        store = open_store(target)
        try:
            if rollout_id is None:
                rows = await rollout_summaries(store, limit)
                if otlp_path is not None:
                    spans = [s for row in rows for s in await store.query_spans(row["rollout_id"], ALL_ATTEMPTS)]
                    _write_json(otlp_path, spans_to_otlp_json(spans))
                if as_json:
                    print(json.dumps({"rollouts": rows}, default=str))
                else:
                    print_summaries(console, rows, target)
                return
            detail = await rollout_detail(store, rollout_id, all_attempts)
            if otlp_path is not None:
                _write_json(otlp_path, spans_to_otlp_json(detail["spans"]))
            if as_json:
                data = {
                    "rollout": detail["rollout"].model_dump(mode="json"),
                    "attempts": [a.model_dump(mode="json") for a in detail["attempts"]],
                    "spans": [s.model_dump(mode="json") for s in detail["spans"]],
                }
                print(json.dumps(data))
            else:
                print_rollout(console, detail["rollout"], detail["attempts"], detail["spans"])
        finally:
            await store.close()

    asyncio.run(main())
    if otlp_path is not None and not as_json:
        console.print(f"[dim]wrote OTLP/JSON spans to {otlp_path}[/dim]")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(data, ensure_ascii=False))
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None
