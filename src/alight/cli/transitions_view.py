"""`alight trace RUN --rollout ID --transitions`: the transitions a rollout yields, to debug credit assignment.

The rollout's whole group is read (advantages compare a rollout with the other rollouts of its
task), adapted with the experiment's adapter and algorithm settings (from `--config`, then the
command line's overrides), and the rollout's transitions are shown with their agent, step, prompt
and response lengths, reward and advantage.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.errors import ConfigError
from alight.store.base import Store
from alight.types import Rollout, Span, Transition


@dataclasses.dataclass
class TransitionSettings:
    """Adapter/algorithm settings from the command line; None keeps the config's (or the default) value."""

    config: Path | None = None
    agent_match: str | None = None
    credit: str | None = None
    mode: str | None = None
    advantage: str | None = None
    gamma: float | None = None


def resolve_settings(settings: TransitionSettings) -> tuple[AdapterConfig, AlgorithmConfig]:
    """The `adapter` and `algorithm` config groups: the config file's (defaults without one), then overrides."""
    adapter, algorithm = AdapterConfig(), AlgorithmConfig()
    if settings.config is not None:
        from alight.config.loading import load_config, to_object

        experiment = to_object(load_config(settings.config))
        adapter, algorithm = experiment.adapter, experiment.algorithm
    overrides: dict[str, Any] = {
        "agent_match": settings.agent_match,
        "credit": settings.credit,
        "mode": settings.mode,
        "gamma": settings.gamma,
    }
    adapter = dataclasses.replace(adapter, **{k: v for k, v in overrides.items() if v is not None})
    if settings.advantage is not None:
        algorithm = dataclasses.replace(algorithm, advantage=settings.advantage)
    return adapter, algorithm


async def group_spans(store: Store, rollout_id: str) -> tuple[Rollout, list[Rollout], dict[str, list[Span]]]:
    """The rollout, its group's ended rollouts (itself included, in enqueue order) and their spans."""
    rollout = await store.get_rollout(rollout_id)
    group = [rollout]
    if rollout.group_id is not None:
        members = await store.list_rollouts(group_id=rollout.group_id)
        group = [r for r in members if r.rollout_id == rollout_id or r.status.is_terminal]
    spans = {r.rollout_id: await store.query_spans(r.rollout_id) for r in group if r.attempt_count}
    return rollout, group, spans


async def rollout_transitions(store: Store, rollout_id: str, settings: TransitionSettings) -> dict[str, Any]:
    """What `--transitions` shows, as JSON-ready data: settings, the group, the rollout's transitions, stats."""
    from alight.algorithms import LightningRL

    adapter_cfg, algorithm_cfg = resolve_settings(settings)
    rl = LightningRL.from_config(adapter_cfg, algorithm_cfg)
    rollout, group, spans = await group_spans(store, rollout_id)
    transitions, stats = rl.adapt_rollouts(group, spans)
    by_rollout: dict[str, list[Transition]] = {}
    for transition in transitions:
        by_rollout.setdefault(transition.rollout_id, []).append(transition)
    return {
        "rollout_id": rollout.rollout_id,
        "group_id": rollout.group_id,
        "reward": rollout.reward,
        "settings": {
            "agent_match": adapter_cfg.agent_match,
            "mode": adapter_cfg.mode,
            "credit": adapter_cfg.credit,
            "gamma": adapter_cfg.gamma,
            "advantage": algorithm_cfg.advantage,
            "norm_std": algorithm_cfg.norm_std,
        },
        "group": [
            {
                "rollout_id": r.rollout_id,
                "status": r.status.value,
                "reward": r.reward,
                "transitions": len(by_rollout.get(r.rollout_id, [])),
            }
            for r in group
        ],
        "transitions": [transition_row(t) for t in by_rollout.get(rollout.rollout_id, [])],
        "stats": stats.as_dict(),
    }


def transition_row(t: Transition) -> dict[str, Any]:
    """One transition as shown: agent, step, lengths, reward, advantage, and its ids for `--json`."""
    calls = t.metadata.get("calls", 1) if t.metadata else 1
    return {
        "step_index": t.step_index,
        "agent_name": t.agent_name,
        "span_id": t.span_id,
        "calls": calls,
        "prompt_length": len(t.prompt_ids),
        "response_length": len(t.response_ids),
        "trained_tokens": len(t.response_ids) if t.response_mask is None else int(sum(t.response_mask)),
        "has_logprobs": t.response_logprobs is not None,
        "reward": t.reward,
        "advantage": t.advantage,
        "prompt_ids": _as_list(t.prompt_ids),
        "response_ids": _as_list(t.response_ids),
        "response_mask": _as_list(t.response_mask),
        "span_ids": t.metadata.get("span_ids", [t.span_id]) if t.metadata else [t.span_id],
    }


def _as_list(ids: Any) -> Any:
    """Ids as JSON can hold them: a transition may carry numpy arrays (the store's bulk read)."""
    return ids.tolist() if hasattr(ids, "tolist") else ids


_COLUMNS = ("step", "agent", "span", "calls", "prompt", "response", "trained", "logprobs", "reward", "advantage")


def print_transitions(console: Console, data: dict[str, Any]) -> None:
    s = data["settings"]
    match = s["agent_match"] if s["agent_match"] is not None else "(every agent)"
    title = (
        f"Transitions of rollout {data['rollout_id']}  reward {_num(data['reward'])}\n"
        f"mode {s['mode']}  credit {s['credit']}  advantage {s['advantage']}  agent_match {match}"
    )
    table = Table(title=title, title_justify="left")
    for column in (
        "step",
        "agent",
        "span",
        "calls",
        "prompt",
        "response",
        "trained",
        "logprobs",
        "reward",
        "advantage",
    ):
        table.add_column(column, justify="left" if column in ("agent", "span", "logprobs") else "right")
    for row in data["transitions"]:
        table.add_row(
            str(row["step_index"]),
            row["agent_name"] or "-",
            (row["span_id"] or "-")[:8],
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
    console.print(f"group {data['group_id'] or '(none)'}: {len(group)} rollouts, rewards {rewards}")
    stats = data["stats"]
    skipped = {k: v for k, v in stats.items() if k.startswith(("calls_skipped", "rollouts_without")) and v}
    line = f"group: {stats['llm_calls']} LLM calls, {stats['calls_kept']} kept, {stats['transitions']} transitions"
    if skipped:
        line += "; " + ", ".join(f"{k} {v}" for k, v in skipped.items())
    console.print(f"[dim]{line}[/dim]")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def run_transitions(
    target: str, rollout_id: str, settings: TransitionSettings, *, as_json: bool, console: Console
) -> None:
    """The body of `alight trace RUN --rollout ID --transitions`."""
    import asyncio

    from alight.cli.trace_view import open_store

    async def main() -> dict[str, Any]:
        store = open_store(target)
        try:
            return await rollout_transitions(store, rollout_id, settings)
        finally:
            await store.close()

    data = asyncio.run(main())
    if as_json:
        print(json.dumps(data))
    else:
        print_transitions(console, data)


def check_options(rollout_id: str | None, transitions: bool, overrides: Sequence[object]) -> None:
    """Adapter options only make sense with `--transitions`, and `--transitions` with `--rollout`."""
    if transitions and rollout_id is None:
        raise ConfigError("--transitions needs --rollout ID (the rollout whose transitions to show)")
    if not transitions and any(o is not None for o in overrides):
        raise ConfigError("--agent-match, --credit, --mode, --advantage, --gamma and --config need --transitions")
