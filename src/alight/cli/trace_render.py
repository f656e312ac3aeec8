"""How `alight trace` shows what `alight.commands.trace` reads: the rollouts table, one rollout's
span tree, the transitions table; or each as one JSON object on stdout (`--json`).

What a run holds comes from agents and models (an untrained model emits arbitrary bytes): every
text shown to a person goes through `printable`, and never through Rich markup."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from alight import semconv
from alight.commands.trace import RolloutDetail
from alight.types import Span, SpanKind


def rollouts(console: Console, rows: Sequence[dict[str, Any]], where: str, *, as_json: bool) -> None:
    """The rollouts of the run at `where`, one row each."""
    if as_json:
        print(json.dumps({"rollouts": rows}, default=str))
        return
    table = Table(title=Text(f"Rollouts in {printable(where)}"), title_justify="left")
    for column in ("rollout", "mode", "status", "reward", "attempts", "LLM calls", "tool calls", "duration"):
        table.add_column(column, justify="right" if column not in ("rollout", "mode", "status") else "left")
    for row in rows:
        table.add_row(
            Text(printable(row["rollout_id"])),
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
        hint = f"alight trace {where} --rollout {rows[0]['rollout_id']}  shows one rollout's spans"
        console.print(Text(printable(hint), style="dim"))


def rollout(console: Console, detail: RolloutDetail, *, as_json: bool) -> None:
    """One rollout as a tree: its attempts, and under each its spans (children under their parent)."""
    if as_json:
        data = {
            "rollout": detail.rollout.model_dump(mode="json"),
            "attempts": [a.model_dump(mode="json") for a in detail.attempts],
            "spans": [s.model_dump(mode="json") for s in detail.spans],
        }
        print(json.dumps(data))
        return
    rollout, attempts, spans = detail.rollout, detail.attempts, detail.spans
    task = json.dumps(rollout.task.input, ensure_ascii=False, default=str)
    head = Tree(
        Text.assemble(
            (f"rollout {printable(rollout.rollout_id)}", "bold"),
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
                f" {printable(attempt.attempt_id)}  ",
                (attempt.status.value, _status_style(attempt.status.value)),
                f"  worker {printable(attempt.worker_id or '-')}",
            )
        )
        if attempt.error:
            node.add(Text(_clip(attempt.error.strip().splitlines()[-1], 160), style="red"))
        _add_span_tree(node, by_attempt.get(attempt.attempt_id, []))
    console.print(head)


def _add_span_tree(node: Tree, spans: Sequence[Span]) -> None:
    ids = {span.span_id for span in spans}
    by_id = {span.span_id: span for span in spans}
    children: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)

    def add(parent_node: Tree, parent_id: str | None) -> None:
        parent_service = _service(by_id[parent_id]) if parent_id is not None else None
        for span in children.get(parent_id, []):
            service = _service(span)
            label = span_label(span, service=service if service != parent_service else None)
            add(parent_node.add(label), span.span_id)

    add(node, None)


def _service(span: Span) -> str | None:
    """The `service.name` of the OpenTelemetry resource a span was received with."""
    name = span.attributes.get(_SERVICE_NAME)
    return None if name is None else str(name)


_SERVICE_NAME = semconv.RESOURCE_PREFIX + "service.name"


def span_label(span: Span, *, service: str | None = None) -> Text:
    """One line per span: kind, name, agent, timing and what matters for its kind (and the
    sending `service`, where given)."""
    a = span.attributes
    kind = (f"{span.kind.value:<6}", _KIND_STYLE.get(span.kind, ""))
    label = Text.assemble(kind, " ", (_clip(span.name, 80), "bold"))
    agent = a.get(semconv.AGENT_NAME) or a.get(semconv.GEN_AI_AGENT_NAME) or a.get(semconv.PLAIN_AGENT_NAME)
    if agent:
        label.append(f"  [{_clip(str(agent), 40)}]", style="cyan")
    if service:
        label.append(f"  service {_clip(service, 40)}", style="blue")
    if span.end_time is not None:
        label.append(f"  {_seconds(span.end_time - span.start_time)}", style="dim")
    label.append("  " + printable(_details(span)))
    if span.status.value == "error":
        label.append(f"  error: {_clip(_error_text(span), 100)}", style="red")
    return label


def _error_text(span: Span) -> str:
    """What went wrong: the status message, else error.type, else the span's exception event."""
    a = span.attributes
    for event in a.get(semconv.OTEL_EVENTS) or ():
        if isinstance(event, dict) and event.get("name") == "exception":
            found = event.get("attributes") or {}
            exception = f"{found.get(semconv.EXCEPTION_TYPE, '')}: {found.get(semconv.EXCEPTION_MESSAGE, '')}"
            break
    else:
        exception = ""
    return span.status_message or exception or str(a.get(semconv.ERROR_TYPE) or "")


def _first(a: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if a.get(key) is not None:
            return a[key]
    return None


def _tokens(a: dict[str, Any]) -> str:
    """`prompt->response tokens`: the lengths of the token ids, else the usage the span reports."""
    prompt, response = a.get(semconv.LLM_PROMPT_TOKEN_IDS), a.get(semconv.LLM_RESPONSE_TOKEN_IDS)
    if isinstance(prompt, list) and isinstance(response, list) and prompt:
        return f"{len(prompt)}->{len(response)} tokens"
    usage = a.get(semconv.LLM_USAGE)
    usage = usage if isinstance(usage, dict) else {}
    inputs = _first(usage, "prompt_tokens", "input_tokens")
    outputs = _first(usage, "completion_tokens", "output_tokens")
    inputs = _first(a, semconv.GEN_AI_INPUT_TOKENS, semconv.GEN_AI_OLD_INPUT_TOKENS) if inputs is None else inputs
    outputs = _first(a, semconv.GEN_AI_OUTPUT_TOKENS, semconv.GEN_AI_OLD_OUTPUT_TOKENS) if outputs is None else outputs
    return f"{'?' if inputs is None else inputs}->{'?' if outputs is None else outputs} tokens"


def _tool_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _details(span: Span) -> str:
    a = span.attributes
    if span.kind == SpanKind.LLM:
        message = a.get(semconv.LLM_RESPONSE_MESSAGE)
        message = message if isinstance(message, dict) else {}
        calls = [c.get("function", {}).get("name", "?") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        model = _first(a, semconv.LLM_RESPONSE_MODEL, semconv.LLM_REQUEST_MODEL, semconv.GEN_AI_RESPONSE_MODEL)
        parts = [f"model {_clip(str(model), 40)}"] if model is not None else []
        if a.get(semconv.LLM_ADAPTER) is not None:  # per-agent LoRA: the adapter that answered
            parts.append(f"adapter {a[semconv.LLM_ADAPTER]}")
        parts += [
            _tokens(a),
            f"finish {a.get(semconv.LLM_FINISH_REASON, '?')}",
            f"ids {a.get(semconv.LLM_TOKEN_IDS_SOURCE, 'none')}",
        ]
        if a.get(semconv.RESOURCES_VERSION) is not None:
            parts.append(f"v{a[semconv.RESOURCES_VERSION]}")
        text = message.get("content") or a.get(semconv.LLM_RESPONSE_TEXT)
        if calls:
            parts.append("calls " + ", ".join(calls))
        elif text:
            parts.append(repr(_cut(" ".join(str(text).split()), 60)))  # repr escapes
        return "  ".join(parts)
    if span.kind == SpanKind.TOOL:
        name = _first(a, semconv.TOOL_NAME, semconv.GEN_AI_TOOL_NAME) or span.name
        args = _first(a, semconv.TOOL_ARGUMENTS, semconv.GEN_AI_TOOL_CALL_ARGUMENTS)
        out = _first(a, semconv.TOOL_OUTPUT, semconv.GEN_AI_TOOL_CALL_RESULT)
        args_text = "" if args is None else _clip(_tool_text(args), 50)
        out_text = "-" if out is None else _clip(_tool_text(out), 50)
        return f"{_clip(str(name), 40)}({args_text}) -> {out_text}" + (
            "  (tool error)" if a.get(semconv.TOOL_ERROR) else ""
        )
    if span.kind == SpanKind.REWARD:
        name = a.get(semconv.REWARD_NAME)
        return f"{_fmt(a.get(semconv.REWARD_VALUE))}" + (f" ({name})" if name else "")
    if span.kind == SpanKind.AGENT and a.get(semconv.GEN_AI_AGENT_ID) is not None:
        return f"id {_clip(str(a[semconv.GEN_AI_AGENT_ID]), 40)}"
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


def printable(text: str) -> str:
    """`text` with each character a terminal would not show as itself (control characters such
    as ESC, line breaks, invisible format characters) written as its escape: \\x1b, \\x0a, \\u200b."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _clip(text: str, width: int) -> str:
    """`text` on one line (whitespace runs as one space), cut to `width`, made printable."""
    return printable(_cut(" ".join(text.split()), width))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


_COLUMNS = ("step", "agent", "span", "calls", "prompt", "response", "trained", "logprobs", "reward", "advantage")


def transitions(console: Console, data: dict[str, Any], *, as_json: bool) -> None:
    """The rollout's transitions as a table, then its group and the adapter's counts."""
    if as_json:
        print(json.dumps(data))
        return
    s = data["settings"]
    match = s["agent_match"] if s["agent_match"] is not None else "(every agent)"
    title = f"Transitions of rollout {printable(data['rollout_id'])}  reward {_num(data['reward'])}\n" + printable(
        f"mode {s['mode']}  credit {s['credit']}  advantage {s['advantage']}  agent_match {match}"
    )
    table = Table(title=Text(title), title_justify="left")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column in ("agent", "span", "logprobs") else "right")
    for row in data["transitions"]:
        table.add_row(
            str(row["step_index"]),
            Text(_clip(row["agent_name"] or "-", 40)),
            Text(printable((row["span_id"] or "-")[:8])),
            str(row["calls"]),
            str(row["prompt_length"]),
            str(row["response_length"]),
            str(row["trained_tokens"]),
            "yes" if row["has_logprobs"] else "no",
            _num(row["reward"]),
            _num(row["advantage"]),
        )
    console.print(table)
    group = data["group"]
    rewards = ", ".join(_num(r["reward"]) for r in group)
    console.print(Text(f"group {printable(data['group_id'] or '(none)')}: {len(group)} rollouts, rewards {rewards}"))
    stats = data["stats"]
    skipped = {k: v for k, v in stats.items() if k.startswith(("calls_skipped", "rollouts_without")) and v}
    line = f"group: {stats['llm_calls']} LLM calls, {stats['calls_kept']} kept, {stats['transitions']} transitions"
    if skipped:
        line += "; " + ", ".join(f"{k} {v}" for k, v in skipped.items())
    console.print(f"[dim]{line}[/dim]")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def sft_export(done: dict[str, Any], *, as_json: bool) -> None:
    """What `--export-sft` wrote: rows, where, and the selection's counts."""
    if as_json:
        print(json.dumps(done))
        return
    print(
        f"wrote {done['rows']} chat rows to {printable(done['out'])} ({done['format']}): {done['selected']} "
        f"transitions selected ({done['select']}, reward >= {done['min_reward']:g}) of {done['transitions']} from "
        f"{done['eligible']} succeeded {'/'.join(done['splits'])} rollouts; {done['duplicates']} duplicates dropped"
    )
