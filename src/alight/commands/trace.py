"""Reading a run's store (`alight trace`): its rollouts, one rollout's spans, the transitions a
rollout yields, and their export as OTLP/JSON.

A run is read from a run directory (its `store.db`), a SQLite store file or a store server URL.
Transitions are computed as training computes them: the rollout's whole group is read
(advantages compare a rollout with the other rollouts of its task) and adapted with the
experiment's `adapter` and `algorithm` settings, loaded like every command's config (a YAML file
and Hydra overrides; the defaults without a file).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.errors import ConfigError
from alight.store.base import LATEST_ATTEMPT, Store
from alight.trainer.run_dir import STORE_FILE
from alight.types import Attempt, Rollout, Span, SpanKind, Transition

T = TypeVar("T")

#: The experiment defaults, for reading transitions without a config file (names no real agent:
#: reading a run runs none).
DEFAULTS_FILE = Path(__file__).with_name("trace_defaults.yaml")


@dataclass
class RolloutDetail:
    """One rollout as recorded: the rollout, its attempts and their spans."""

    rollout: Rollout
    attempts: list[Attempt]
    spans: list[Span]


def open_store(target: str) -> Store:
    """A store from a run directory, a SQLite file or a store server URL."""
    from alight.store.factory import StoreSpec
    from alight.store.factory import open_store as open_spec

    if target.startswith(("http://", "https://")):
        return open_spec(target, max_retries=1)
    path = Path(target).expanduser()
    if path.is_dir():
        path = path / STORE_FILE
    if not path.is_file():
        raise ConfigError(f"{target}: no run directory, store file or store URL there (looked for {path})")
    return open_spec(StoreSpec("sqlite", path=path), create=False)


def read_rollouts(target: str, *, limit: int = 50, otlp_path: Path | None = None) -> list[dict[str, Any]]:
    """The run's first `limit` rollouts, one dict each (see `rollout_summaries`); with `otlp_path`,
    every span of them (all attempts) is written there as OTLP/JSON."""

    async def read(store: Store) -> list[dict[str, Any]]:
        rows = await rollout_summaries(store, limit)
        if otlp_path is not None:
            spans = [s for row in rows for s in await store.query_spans(row["rollout_id"])]
            write_otlp(otlp_path, spans)
        return rows

    return _reading(target, read)


def read_rollout(
    target: str, rollout_id: str, *, all_attempts: bool = False, otlp_path: Path | None = None
) -> RolloutDetail:
    """One rollout with its attempts and spans (the last attempt's, or with `all_attempts` every
    attempt's); with `otlp_path`, those spans are written there as OTLP/JSON."""

    async def read(store: Store) -> RolloutDetail:
        detail = RolloutDetail(
            rollout=await store.get_rollout(rollout_id),
            attempts=await store.list_attempts(rollout_id),
            spans=await store.query_spans(rollout_id, None if all_attempts else LATEST_ATTEMPT),
        )
        if otlp_path is not None:
            write_otlp(otlp_path, detail.spans)
        return detail

    return _reading(target, read)


def read_transitions(
    target: str, rollout_id: str, *, config: Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """The transitions `rollout_id` yields under the experiment's settings (`config` and Hydra
    `overrides`, checked before the store is opened), as JSON-ready data: the settings, the group,
    the rollout's transitions and the adapter's counts for the group."""
    adapter, algorithm = transition_settings(config, overrides)
    return _reading(target, lambda store: rollout_transitions(store, rollout_id, adapter, algorithm))


def transition_settings(config: Path | None, overrides: Sequence[str] = ()) -> tuple[AdapterConfig, AlgorithmConfig]:
    """The `adapter` and `algorithm` config groups: `config` (the defaults without one) with
    `overrides`, loaded as `alight train` loads them."""
    from alight.config.loading import load_config, to_object

    try:
        experiment = to_object(load_config(config or DEFAULTS_FILE, overrides))
    except ConfigError as err:
        if config is not None:
            raise
        # Name the defaults, not the file in the package that holds them.
        raise ConfigError(str(err).replace(f"config {DEFAULTS_FILE}", "default config", 1)) from None
    return experiment.adapter, experiment.algorithm


def _reading(target: str, read: Callable[[Store], Awaitable[T]]) -> T:
    """`read` on the store at `target`, closed afterwards."""

    async def main() -> T:
        store = open_store(target)
        try:
            return await read(store)
        finally:
            await store.close()

    return asyncio.run(main())


async def rollout_summaries(store: Store, limit: int, offset: int = 0) -> list[dict[str, Any]]:
    """One dict per rollout: ids, status, reward, attempts and span counts by kind."""
    rollouts = await store.list_rollouts(limit=limit, offset=offset)
    rows = []
    for rollout in rollouts:
        spans = await store.query_spans(rollout.rollout_id, LATEST_ATTEMPT) if rollout.attempt_count else []
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


async def group_spans(store: Store, rollout_id: str) -> tuple[Rollout, list[Rollout], dict[str, list[Span]]]:
    """The rollout, its group's ended rollouts (itself included, in enqueue order) and their spans."""
    rollout = await store.get_rollout(rollout_id)
    group = [rollout]
    if rollout.group_id is not None:
        members = await store.list_rollouts(group_id=rollout.group_id)
        group = [r for r in members if r.rollout_id == rollout_id or r.status.is_terminal]
    spans = {r.rollout_id: await store.query_spans(r.rollout_id, LATEST_ATTEMPT) for r in group if r.attempt_count}
    return rollout, group, spans


async def rollout_transitions(
    store: Store, rollout_id: str, adapter: AdapterConfig, algorithm: AlgorithmConfig
) -> dict[str, Any]:
    """What `read_transitions` returns, from an open store and resolved settings."""
    from alight.algorithms import LightningRL

    rl = LightningRL.from_config(adapter, algorithm)
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
            "agent_match": adapter.agent_match,
            "mode": adapter.mode,
            "credit": adapter.credit,
            "gamma": adapter.gamma,
            "advantage": algorithm.advantage,
            "norm_std": algorithm.norm_std,
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


def write_otlp(path: Path, spans: Sequence[Span]) -> None:
    """Write `spans` to `path` as OTLP/JSON (what any OpenTelemetry collector reads)."""
    from alight.store.otlp_export import spans_to_otlp_json

    try:
        path.write_text(json.dumps(spans_to_otlp_json(spans), ensure_ascii=False))
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None
