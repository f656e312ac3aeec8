"""Store throughput: full rollout cycles per second and spans per second, per implementation.

Cases:
  memory  8 concurrent clients (asyncio tasks) in one process: a MemoryStore cannot be shared
          across processes, so this measures the store's own cost.
  sqlite  8 client processes opening the same SQLite file.
  http    8 client processes (StoreClient) against the HTTP store server in its own process,
          over a SQLite file (the deployment runners on other machines use).

Metrics:
  rollout_cycles_per_s  each client loops enqueue -> dequeue -> 20 spans (one batch) -> finish
  spans_per_s           each client writes spans in batches of --span-batch into its own attempts

Each measurement runs --repeat times (a fresh store each time); the value is the median, since
timings on a shared 2-core machine vary by about 10% from run to run.

Usage: python benchmarks/store_bench.py [--json] [--seconds 5] [--repeat 3] [--clients 8] [--cases memory,sqlite,http]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any

from alight.store import MemoryStore, Store
from alight.types import AttemptStatus, Rollout, Span, Task
from bench_report import arguments, emit, median_row
from store_process import store_server_process

SPANS_PER_CYCLE = 20


def _span_batch(rollout_id: str, attempt_id: str, n: int) -> list[Span]:
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            name="chat.completions",
            kind="llm",  # type: ignore[arg-type]
            attributes={"model": "tiny", "prompt_tokens": 42, "completion_tokens": 17},
            start_time=time.time(),
            end_time=time.time(),
        )
        for _ in range(n)
    ]


async def _cycles(store: Store, worker: str, until: float) -> int:
    done = 0
    while time.monotonic() < until:
        await store.enqueue([Rollout(task=Task(input={"i": done}))])
        claim = await store.dequeue(worker)
        if claim is None:  # another client took ours; ours is still queued for someone
            continue
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        await store.add_spans(_span_batch(rid, aid, SPANS_PER_CYCLE))
        await store.finish_attempt(aid, AttemptStatus.SUCCEEDED, reward=1.0)
        done += 1
    return done


async def _spans(store: Store, worker: str, until: float, batch: int) -> int:
    await store.enqueue([Rollout(task=Task(input=worker))])
    claim = await store.dequeue(worker)
    assert claim is not None
    # Claims may cross between clients; either way the attempt is ours alone to write into.
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    written = 0
    while time.monotonic() < until:
        written += await store.add_spans(_span_batch(rid, aid, batch))
    return written


async def _run_client(store: Store, metric: str, worker: str, until: float, batch: int) -> int:
    async with store:
        if metric == "rollout_cycles_per_s":
            return await _cycles(store, worker, until)
        return await _spans(store, worker, until, batch)


def _open(target: str) -> Store:
    if target.startswith("http://"):
        from alight.store.client import StoreClient

        return StoreClient(target)
    from alight.store.sqlite import SqliteStore

    return SqliteStore(target)


def _client_process(target: str, metric: str, worker: str, seconds: float, batch: int, barrier: Any, out: Any) -> None:
    store = _open(target)
    barrier.wait()
    out.put(asyncio.run(_run_client(store, metric, worker, time.monotonic() + seconds, batch)))


def _measure_processes(target: str, metric: str, clients: int, seconds: float, batch: int) -> float:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(clients + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_client_process, args=(target, metric, f"w{i}", seconds, batch, barrier, out))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    started = time.monotonic()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    elapsed = time.monotonic() - started
    for p in procs:
        p.join(timeout=30)
    return total / elapsed


def _measure_memory(metric: str, clients: int, seconds: float, batch: int) -> float:
    async def run() -> float:
        store = MemoryStore()
        started = time.monotonic()
        until = started + seconds
        if metric == "rollout_cycles_per_s":
            counts = await asyncio.gather(*(_cycles(store, f"w{i}", until) for i in range(clients)))
        else:
            counts = await asyncio.gather(*(_spans(store, f"w{i}", until, batch) for i in range(clients)))
        return sum(counts) / (time.monotonic() - started)

    return asyncio.run(run())


def measure(case: str, metric: str, clients: int, seconds: float, batch: int, workdir: Path) -> float:
    workdir.mkdir(parents=True, exist_ok=True)
    db = str(workdir / f"{case}-{metric}.db")
    if case == "memory":
        return _measure_memory(metric, clients, seconds, batch)
    if case == "sqlite":
        _open(db)  # create the schema before the clients race to
        return _measure_processes(db, metric, clients, seconds, batch)
    if case == "http":
        with store_server_process(db) as url:
            return _measure_processes(url, metric, clients, seconds, batch)
    raise SystemExit(f"unknown case {case!r} (choose from memory, sqlite, http)")


def main() -> None:
    parser = arguments(__doc__, cases="memory,sqlite,http", repeat=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per case and metric")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--span-batch", type=int, default=100, help="spans per add_spans call (spans metric)")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="alight-store-bench-") as tmp:
        for case in args.cases.split(","):
            for metric in ("rollout_cycles_per_s", "spans_per_s"):
                runs = [
                    measure(case, metric, args.clients, args.seconds, args.span_batch, Path(tmp) / f"run{i}")
                    for i in range(args.repeat)
                ]
                results.append(median_row(case, metric, runs, show_runs=not args.json))
    title = f"{args.clients} clients, median of {args.repeat} runs of {args.seconds:g} s"
    emit("store", results, as_json=args.json, title=title)


if __name__ == "__main__":
    main()
