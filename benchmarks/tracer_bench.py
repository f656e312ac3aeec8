"""Tracing overhead per LLM call, and runner throughput.

Cases:
  light, otel            overhead of one traced `openai` chat completion over the same call
                         untraced (metric overhead_us): the agent calls an endpoint that is not
                         an alight proxy, so the instrumentation records the LLM span itself
                         (messages, sampling, response, usage) inside an attempt context. The main
                         figure; target under 50 us for the light tracer.
  light_proxy_headers,   the same for a call to an alight proxy URL: the instrumentation only
  otel_proxy_headers     adds headers (sequence id, agent, parent span), the proxy writes the span.
  untraced               the untraced call itself (metric call_us), for scale; light and otel also
                         get an overhead_ratio row (traced over untraced call time).
  workers_1/4/8          a RunnerPool of N worker processes running a no-op agent against a store
                         server (SQLite) in its own process (metric rollouts_per_s).

The LLM is an in-process fake: the openai client's httpx transport is an `httpx.MockTransport`
returning a canned chat completion. This measures alight's overhead, not a model or a network, so
a canned answer is the honest baseline: both sides of each difference make the same call through
the real openai SDK, one through the instrumentation and one through the original method. Calls
alternate in blocks of 20 (untraced, traced); a run's value is the median over its blocks of the
difference, and the reported value the median of --repeat runs. Spans are taken
out of the attempt's buffer between blocks: the runner writes them to the store from a background
task (its heartbeat flush), off the agent's call path.

Throughput: rollouts are enqueued in one batch and timed until every one has ended; workers poll
the store every 50 ms (no idle backoff, to measure the runner rather than its polling delay); the
agent makes no LLM call, so the workers skip instrumenting openai (that only costs start-up time,
before the measured window).

Usage: python benchmarks/tracer_bench.py [--json] [--calls 1000] [--repeat 5] [--rollouts 300]
       [--cases light,otel,workers_1,workers_4,workers_8]
"""

from __future__ import annotations

import asyncio
import contextvars
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from alight.agent import rollout
from bench_report import arguments, emit, median_row
from store_process import store_server_process

CANNED_COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "fake-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "2 + 2 = 4"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21},
}
BLOCK = 20  # calls per timed block; traced and untraced blocks alternate
MESSAGES = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2 + 2?"}]


@rollout
async def noop_agent(task: Any) -> float:
    """The throughput benchmark's agent: returns at once."""
    return 1.0


# -- overhead per traced call -------------------------------------------------------------------


def _openai_client(base_url: str) -> Any:
    import httpx
    import openai

    body = orjson.dumps(CANNED_COMPLETION)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    http = httpx.Client(transport=httpx.MockTransport(answer))
    return openai.OpenAI(base_url=base_url, api_key="bench", http_client=http, max_retries=0)


def _per_call_s(call: Callable[[], Any], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - started) / n


def _paired_overheads(traced: Callable[[], Any], untraced: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median over short alternating blocks of (traced - untraced) per call, and the median
    untraced call: neighbouring blocks see the same machine load, so their difference is steady."""
    diffs, bases = [], []
    for _ in range(max(1, calls // BLOCK)):
        base = _per_call_s(untraced, BLOCK)
        diffs.append(_per_call_s(traced, BLOCK) - base)
        bases.append(base)
    return statistics.median(diffs), statistics.median(bases)


async def _overheads(kind: str, calls: int, repeat: int) -> dict[str, list[float]]:
    """Per block: (traced - untraced) seconds per call, for the span path and the proxy path."""
    from openai.resources.chat.completions import completions as module

    from alight.store import MemoryStore
    from alight.tracing import make_tracer
    from alight.types import Rollout, Task

    tracer = make_tracer(kind)
    tracer.instrument()
    original = module.Completions.create.__wrapped__  # type: ignore[attr-defined]
    store = MemoryStore()
    await store.enqueue([Rollout(task=Task(input=None))])
    claim = await store.dequeue("bench")
    assert claim is not None
    rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
    clients = {
        "span": _openai_client("http://llm.bench.invalid/v1"),
        "proxy_headers": _openai_client(f"http://proxy.bench.invalid/rollout/{rid}/attempt/{aid}/v1"),
    }
    out: dict[str, list[float]] = {"span": [], "proxy_headers": [], "untraced": []}
    # The untraced side runs outside the attempt, where the instrumentation's request hook (which
    # every openai request passes, whatever the method) only looks up the context variable.
    outside = contextvars.copy_context()
    async with tracer.attempt(store, claim.rollout, claim.attempt, agent_name="bench") as ctx:
        for path, client in clients.items():
            completions = client.chat.completions

            def traced(completions: Any = completions) -> Any:
                return completions.create(model="fake-model", messages=MESSAGES, temperature=0.7)

            def untraced(completions: Any = completions) -> Any:
                return outside.run(original, completions, model="fake-model", messages=MESSAGES, temperature=0.7)

            _per_call_s(traced, 50)  # warm up both paths
            _per_call_s(untraced, 50)
            ctx.take_finished()
            for _ in range(repeat):
                overhead, base = _paired_overheads(traced, untraced, calls)
                recorded = len(ctx.take_finished())
                if path == "span" and recorded < calls // BLOCK * BLOCK:
                    raise RuntimeError(f"{kind}: {recorded} spans recorded for {calls} calls")
                out[path].append(overhead)
                out["untraced"].append(base)
    return out


# -- runner throughput --------------------------------------------------------------------------


async def _run_batch(url: str, n: int) -> float:
    from alight.store.client import StoreClient
    from alight.types import Rollout, RolloutStatus, Task

    async with StoreClient(url) as client:
        started = time.monotonic()
        queued = await client.enqueue([Rollout(task=Task(input=i)) for i in range(n)])
        ended = await client.wait_for_rollouts([r.rollout_id for r in queued], timeout=600)
        elapsed = time.monotonic() - started
    if len(ended) < n or any(r.status is not RolloutStatus.SUCCEEDED for r in ended):
        raise RuntimeError(f"only {len(ended)} of {n} rollouts ended, or some failed")
    return n / elapsed


def _throughputs(workers: int, rollouts: int, repeat: int, workdir: Path) -> list[float]:
    from alight.runner import RunnerPool

    with store_server_process(str(workdir / f"w{workers}.db")) as url:
        agent = f"{Path(__file__).resolve()}:noop_agent"
        with RunnerPool(agent, url, n_runners=workers, max_poll_interval_s=0.05, instrument=False):
            asyncio.run(_run_batch(url, 20))  # warm up: connections open, SQLite pages cached
            return [asyncio.run(_run_batch(url, rollouts)) for _ in range(repeat)]


# -- report -------------------------------------------------------------------------------------


def main() -> None:
    parser = arguments(__doc__, cases="light,otel,workers_1,workers_4,workers_8", repeat=5)
    parser.add_argument("--calls", type=int, default=1000, help="LLM calls per timed block")
    parser.add_argument("--rollouts", type=int, default=300, help="rollouts per throughput batch")
    args = parser.parse_args()

    results: list[dict[str, Any]] = []

    def add(case: str, metric: str, runs: list[float], digits: int = 1) -> None:
        results.append(median_row(case, metric, runs, digits=digits, show_runs=not args.json))

    cases = args.cases.split(",")
    untraced: list[float] = []
    for kind in ("light", "otel"):
        if kind in cases:
            measured = asyncio.run(_overheads(kind, args.calls, args.repeat))
            add(kind, "overhead_us", [s * 1e6 for s in measured["span"]])
            add(f"{kind}_proxy_headers", "overhead_us", [s * 1e6 for s in measured["proxy_headers"]])
            # Traced over untraced call time: steadier than microseconds on a loaded machine.
            pairs = zip(measured["span"], measured["untraced"][: len(measured["span"])], strict=True)
            add(kind, "overhead_ratio", [(base + extra) / base for extra, base in pairs], digits=3)
            untraced += measured["untraced"]
    if untraced:
        add("untraced", "call_us", [s * 1e6 for s in untraced])
    with tempfile.TemporaryDirectory(prefix="alight-tracer-bench-") as tmp:
        for case in cases:
            if case.startswith("workers_"):
                workers = int(case.split("_")[1])
                add(case, "rollouts_per_s", _throughputs(workers, args.rollouts, args.repeat, Path(tmp)))
            elif case not in ("light", "otel"):
                raise SystemExit(f"unknown case {case!r} (choose from light, otel, workers_N)")

    title = f"overhead per LLM call ({args.calls} calls x {args.repeat}), runner throughput"
    emit("tracer", results, as_json=args.json, title=title)


if __name__ == "__main__":
    main()
