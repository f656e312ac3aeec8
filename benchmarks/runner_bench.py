"""Runner pool throughput: rollouts per second for 1, 2, 4, 8 runners, local pool vs Ray.

Cases are named BACKEND_N_AGENT (`local_4_sleep`, `ray_8_noop`):
  local   `runner.backend: local`: N worker processes under the pool's supervisor
  ray     `runner.backend: ray`: N Ray actors on a local Ray cluster (started once, with as many
          logical CPUs as the actors reserve, at least this machine's cores)
  noop    the agent returns at once: the per-rollout cost of the runners and the store
  sleep   the agent waits --sleep seconds (I/O-bound, like an agent calling tools or a remote
          LLM): rollouts/s should grow with N until the store or the machine is the limit

Every case runs against the same HTTP store server (SQLite) in a process of its own. A pool is
started and warmed up (one rollout per runner) before the clock starts; idle runners poll the
store every 20 ms; the value is the number
of rollouts (--per-runner x N) divided by the time from enqueueing them until all have ended.
Rows `ray_N_AGENT` with metric `ray_vs_local_ratio` divide Ray's figure by the local pool's.

Usage: python benchmarks/runner_bench.py [--json] [--runners 1,2,4,8] [--cases local,ray]
       [--agents noop,sleep] [--sleep 0.2] [--per-runner 20] [--repeat 1]
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from alight.config.schema import RayConfig, RunnerConfig
from alight.store.client import StoreClient
from alight.types import Rollout, Task
from bench_report import Row, arguments, emit, median_row
from store_process import store_server_process

AGENTS = str(Path(__file__).with_name("runner_agents.py"))
RAY_CPUS_PER_RUNNER = 0.5


async def _run_rollouts(url: str, n: int, task: dict[str, Any]) -> float:
    """Enqueue `n` rollouts of `task`, wait until all have ended; the seconds that took."""
    async with StoreClient(url) as client:
        started = time.perf_counter()
        ids = [r.rollout_id for r in await client.enqueue([Rollout(task=Task(input=task)) for _ in range(n)])]
        done = await client.wait_for_rollouts(ids, timeout=600)
        elapsed = time.perf_counter() - started
        if len(done) != n or any(r.reward != 1.0 for r in done):
            raise RuntimeError(f"only {len(done)} of {n} rollouts ended, or some failed")
        return elapsed


def measure(url: str, backend: str, n_runners: int, agent: str, args: Any) -> float:
    """Rollouts per second of one pool of `n_runners` running `agent`."""
    from alight.runner.factory import make_pool

    task = {"sleep": args.sleep} if agent == "sleep" else {}
    n = args.per_runner * n_runners
    cfg = RunnerConfig(backend=backend, n_runners=n_runners, ray=RayConfig(num_cpus=RAY_CPUS_PER_RUNNER))
    # Idle runners poll every 20 ms (not up to 0.5 s), so the clock measures throughput, not poll latency.
    with make_pool(cfg, f"{AGENTS}:{agent}", url, instrument=False, max_poll_interval_s=0.02) as pool:
        asyncio.run(_run_rollouts(url, n_runners, task))  # warm-up: every runner has loaded the agent
        pool.wait_for_idle(timeout_s=60)
        elapsed = asyncio.run(_run_rollouts(url, n, task))
    return n / elapsed


def main() -> None:
    parser = arguments(__doc__, cases="local,ray", repeat=1)
    parser.add_argument("--runners", default="1,2,4,8", help="comma-separated runner counts")
    parser.add_argument("--agents", default="noop,sleep", help="comma-separated agents: noop, sleep")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds the sleep agent waits")
    parser.add_argument("--per-runner", type=int, default=20, help="rollouts measured per runner")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    runner_counts = [int(n) for n in args.runners.split(",")]
    backends = args.cases.split(",")
    agents = args.agents.split(",")

    if "ray" in backends:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no auth token written under the home folder
        cpus = max(os.cpu_count() or 1, math.ceil(max(runner_counts) * RAY_CPUS_PER_RUNNER))
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)

    results: list[Row] = []
    values: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="alight-runner-bench-") as tmp,
        store_server_process(str(Path(tmp) / "store.db")) as url,
    ):
        for agent in agents:
            for backend in backends:
                for n_runners in runner_counts:
                    case = f"{backend}_{n_runners}_{agent}"
                    runs = [measure(url, backend, n_runners, agent, args) for _ in range(args.repeat)]
                    row = median_row(case, "rollouts_per_s", runs, show_runs=not args.json)
                    values[case] = row["value"]
                    results.append(row)
        for case, value in list(values.items()):
            local = values.get(case.replace("ray_", "local_", 1)) if case.startswith("ray_") else None
            if local:
                results.append({"case": case, "metric": "ray_vs_local_ratio", "value": round(value / local, 3)})
    if "ray" in backends:
        import ray

        ray.shutdown()
    title = f"{args.per_runner} rollouts per runner, sleep agent {args.sleep:g} s, median of {args.repeat}"
    emit("runner", results, as_json=args.json, title=title)


if __name__ == "__main__":
    main()
