"""LightningRL throughput: stored spans -> transitions with rewards and advantages -> TransitionBatch.

A SQLite store is filled once (outside the timing) with --rollouts finished rollouts in groups of
--group-size, each with --calls LLM calls as the proxy records them (messages, prompt ids of about
100-300 tokens, responses of 30-60 tokens with log-probs) made by three agents (writer, then
checker and rewriter in turn, each continuing its own conversation), an agent span, a tool span
and the final reward span. Then, training step by training step (--step-rollouts rollouts, whole
groups), the timed pipeline runs as the trainer's does:

  read        SqliteStore.rollout_dicts + span_dicts(arrays=True): no pydantic; LLM spans built from
              columns, their ids and log-probs numpy arrays over the stored bytes (no JSON);
              the other spans (agent, tool, reward) parsed with orjson
  adapt       SpanAdapter.adapt per rollout (agent_match, order, rewards attached; the arrays are
              kept, sliced or concatenated, never turned into Python ints)
  advantages  credit assignment + GRPO advantages over the step's groups (LightningRL.assign,
              numpy over the step)
  batch       TransitionBatch.from_transitions (one np.concatenate per column, padded torch tensors)

Cases: `transition` (one transition per LLM call) through the columnar fast path
(`LightningRL.batch_from_store`: `SqliteStore.llm_columns` reads every LLM call of the step as flat
numpy arrays, then agent_match, truncation, credit, advantages and the batch are numpy over the
whole step, no Python object per span or transition; its split is read_s and build_s); `http`, the
same path over a store server (the SQLite store behind `alight store`'s HTTP server on loopback, in
this process: `StoreClient.llm_columns` gets the step's columns as one binary body; its row
sqlite_ratio is its transitions/s over the `transition` case's, in the same run); the same mode
through the object path above (`transition_objects`); and `trajectory` (an agent's calls merged
into one masked sequence; object path). Rows per case: transitions_per_s (transitions made
/ total seconds), calls_per_s (LLM calls adapted / total seconds, comparable across modes) and the
split read_s, adapt_s, advantages_s, batch_s, total_s (seconds for all rollouts). Each value is the
median of --repeat runs. The cyclic GC is paused during each step, as the trainer should do (the
pipeline allocates millions of objects and no cycle; the collections cost about 2x): --keep-gc
measures with it on.

Usage: python benchmarks/adapter_bench.py [--json] [--repeat 3] [--rollouts 10000]
       [--cases transition,http,transition_objects,trajectory]
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from adapter_data import populate
from alight.adapters import AdapterStats
from alight.algorithms import LightningRL
from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.store.base import Store
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from bench_report import arguments, emit, median_row

PHASES = ("read", "adapt", "advantages", "batch")
COLUMNAR_PHASES = ("read", "build")


async def run_columnar(
    store: Store, ids: list[str], rl: LightningRL, step_rollouts: int, pause_gc: bool = True
) -> dict[str, float]:
    """`run_once` through `LightningRL.batch_from_store`'s two halves: the columnar read, then the build."""
    clock = time.perf_counter
    spent = dict.fromkeys(COLUMNAR_PHASES, 0.0)
    transitions = calls = 0
    for start in range(0, len(ids), step_rollouts):
        step = ids[start : start + step_rollouts]
        if pause_gc:
            gc.disable()
        t0 = clock()
        columns = await store.llm_columns(step)
        t1 = clock()
        batch, stats = await rl.batch_from_columns(store, columns, pad_id=0)
        t2 = clock()
        gc.enable()
        assert batch is not None and len(batch) == stats.transitions
        spent["read"] += t1 - t0
        spent["build"] += t2 - t1
        transitions += stats.transitions
        calls += stats.calls_kept
    return {**spent, "total": sum(spent.values()), "transitions": transitions, "calls": calls}


async def run_once(
    store: SqliteStore, ids: list[str], rl: LightningRL, step_rollouts: int, pause_gc: bool = True
) -> dict[str, float]:
    """One pass over every rollout, step by step; seconds per phase and the counts made."""
    clock = time.perf_counter
    spent = dict.fromkeys(PHASES, 0.0)
    transitions = calls = 0
    for start in range(0, len(ids), step_rollouts):
        step = ids[start : start + step_rollouts]
        if pause_gc:  # the step allocates millions of objects and no cycle: collections only rescan them
            gc.disable()
        t0 = clock()
        rollouts = await store.rollout_dicts(step)
        spans = await store.span_dicts(step, arrays=True)
        t1 = clock()
        stats = AdapterStats()
        adapted = [
            rl.adapter.adapt(
                spans[r["rollout_id"]],
                rollout_id=r["rollout_id"],
                group_id=r["group_id"],
                reward=r["reward"],
                stats=stats,
            )
            for r in rollouts
        ]
        t2 = clock()
        made = rl.assign(adapted, stats)
        t3 = clock()
        batch = rl.batch(made, pad_id=0)
        t4 = clock()
        gc.enable()
        assert len(batch) == len(made) == stats.transitions
        for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[phase] += seconds
        transitions += len(made)
        calls += stats.calls_kept
    return {**spent, "total": sum(spent.values()), "transitions": transitions, "calls": calls}


def measure(path: Path, ids: list[str], case: str, args: Any) -> list[dict[str, float]]:
    mode = "transition" if case in ("transition_objects", "http") else case
    rl = LightningRL.from_config(
        AdapterConfig(agent_match=args.agent_match, mode=mode, credit=args.credit), AlgorithmConfig(advantage="grpo")
    )
    run = run_columnar if case in ("transition", "http") else run_once

    async def runs(store: Store) -> list[dict[str, float]]:
        await run(store, ids[: args.step_rollouts], rl, args.step_rollouts)  # warm-up: imports, caches
        return [await run(store, ids, rl, args.step_rollouts, not args.keep_gc) for _ in range(args.repeat)]

    async def local() -> list[dict[str, float]]:
        async with SqliteStore(path) as store:
            return await runs(store)

    async def remote(url: str) -> list[dict[str, float]]:
        async with StoreClient(url) as client:
            return await runs(client)

    if case != "http":
        return asyncio.run(local())
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(StoreServer(SqliteStore(path), watchdog_interval_s=None))
        return asyncio.run(remote(server.url))


def rows(case: str, runs: list[dict[str, float]], show: bool) -> list[dict[str, Any]]:
    out = [
        median_row(case, "transitions_per_s", [r["transitions"] / r["total"] for r in runs], show_runs=show),
        median_row(case, "calls_per_s", [r["calls"] / r["total"] for r in runs], show_runs=show),
    ]
    phases = COLUMNAR_PHASES if case in ("transition", "http") else PHASES
    for phase in (*phases, "total"):
        out.append(median_row(case, f"{phase}_s", [r[phase] for r in runs], digits=3, show_runs=show))
    return out


def main() -> None:
    parser = arguments(__doc__, cases="transition,http,transition_objects,trajectory", repeat=3)
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts in the store")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (GRPO group)")
    parser.add_argument("--calls", type=int, default=5, help="LLM calls per rollout")
    parser.add_argument("--step-rollouts", type=int, default=512, help="rollouts per training step (whole groups)")
    parser.add_argument("--agent-match", default=None, help="adapter agent_match regex (default: every agent)")
    parser.add_argument("--credit", default="identity", help="credit assignment mode")
    parser.add_argument("--keep-gc", action="store_true", help="leave the cyclic GC on during each step")
    args = parser.parse_args()
    if args.step_rollouts % args.group_size:
        raise SystemExit("--step-rollouts must be a multiple of --group-size: a step holds whole groups")

    results = []
    with tempfile.TemporaryDirectory(prefix="alight-adapter-bench-") as tmp:
        path = Path(tmp) / "store.db"
        started = time.perf_counter()
        ids = populate(path, rollouts=args.rollouts, group_size=args.group_size, calls=args.calls)
        if not args.json:
            print(f"populated {args.rollouts} rollouts in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for case in args.cases.split(","):
            runs = measure(path, ids, case, args)
            results += rows(case, runs, show=not args.json)
            if not args.json:
                made = statistics.median(r["transitions"] for r in runs)
                print(f"{case}: {made:.0f} transitions from {args.rollouts} rollouts", file=sys.stderr)
    speed = {r["case"]: r["value"] for r in results if r["metric"] == "transitions_per_s"}
    if "http" in speed and "transition" in speed:  # the store server's share of SQLite's speed, same run
        results.append(
            {"case": "http", "metric": "sqlite_ratio", "value": round(speed["http"] / speed["transition"], 3)}
        )
    title = (
        f"{args.rollouts} rollouts x {args.calls} LLM calls, groups of {args.group_size}, steps of "
        f"{args.step_rollouts} rollouts, median of {args.repeat} runs"
    )
    emit("adapter", results, as_json=args.json, title=title, digits=3)


if __name__ == "__main__":
    main()
