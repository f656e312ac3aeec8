"""Store under load: many runner clients against one `alight store` server process.

The server is the real CLI (`python -m alight store --db FILE`), over SQLite, in its own process.
`--clients` runner clients (default 64), each its own `StoreClient` with its own connections, spread
over `--processes` client processes (default 4: 64 Python processes would not fit a small machine),
loop for `--seconds` (default 60) through a runner's cycle:

  dequeue (again after 20 ms while the queue is empty) -> get_latest_resources -> start_attempt
  -> heartbeat -> 3 x add_spans (4 LLM spans of 64 prompt and 16 response token ids each)
  -> heartbeat -> finish_attempt (succeeded, reward 1.0)

The algorithm's side, in the main process, keeps at least 2 x clients rollouts queued (enqueue in
batches, its requests not counted) and publishes one resource set first.

Metrics (case `<clients>_clients`):
  requests_per_s   runner requests answered per second, all processes together
  p50_ms, p99_ms   latency of one runner request (a call of the StoreClient, retries included)
  errors           runner requests that raised (target 0)
  rollout_cycles_per_s   full cycles per second
  server_rss_mb    resident memory of the server process at the end (VmRSS from /proc)
  server_peak_rss_mb     its peak (VmHWM)

Tokens: `--token T` starts the server with `ALIGHT_TOKEN=T` (what `alight store --token` reads) and
gives every client `token=T` (the admin token, shared); each runner also gives its `runner_id`.

Per-attempt keys: `--keys T` measures two cases in one run, on the same machine one after the
other: `<clients>_clients_shared_token` (as `--token T`) and `<clients>_clients_per_attempt_keys`,
where the server runs with `--agent-spans`, each runner registers its own runner credential
(`POST /store/runners`) and claims, starts, heartbeats and finishes with it, and the 3 span writes
of each cycle go with the attempt's agent key, as an agent posting its own spans would (one
connection pool per runner, its bearer swapped per attempt: the key check is measured, not
connection set-up). A row `overhead_ratio` gives keys / shared requests per second.

Usage: python benchmarks/load_bench.py [--json] [--seconds 60] [--clients 64] [--processes 4] [--token T | --keys T]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from alight.semconv import LLM_PROMPT_TOKEN_IDS, LLM_RESPONSE_LOGPROBS, LLM_RESPONSE_TOKEN_IDS
from alight.store import Store
from alight.types import AttemptStatus, LLMResource, Rollout, RolloutStatus, Span, Task
from bench_report import emit

T = TypeVar("T")

SPAN_CALLS = 3  # add_spans calls per cycle
SPANS_PER_CALL = 4
IDLE_S = 0.02  # a runner's pause when the queue is empty


def _spans(rollout_id: str, attempt_id: str) -> list[Span]:
    at = time.time()
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            name="chat.completions",
            kind="llm",  # type: ignore[arg-type]
            attributes={
                LLM_PROMPT_TOKEN_IDS: list(range(64)),
                LLM_RESPONSE_TOKEN_IDS: list(range(16)),
                LLM_RESPONSE_LOGPROBS: [-0.5] * 16,
                "model": "tiny",
            },
            start_time=at,
            end_time=at,
        )
        for _ in range(SPANS_PER_CALL)
    ]


class _Runner:
    """One runner client: its own StoreClient; times every request it makes."""

    def __init__(
        self, store: Store, worker_id: str, latencies: array[float], errors: list[str], agent: Any = None
    ) -> None:
        self.store, self.worker_id, self.latencies, self.errors = store, worker_id, latencies, errors
        self.agent = agent  # with per-attempt keys: the client the agent's span writes go through
        self.cycles = 0

    async def timed(self, call: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        try:
            return await call()
        except Exception as err:
            self.errors.append(f"{type(err).__name__}: {err}")
            raise
        finally:
            self.latencies.append(time.perf_counter() - started)

    async def run(self, until: float) -> None:
        async with self.store:
            while time.monotonic() < until:
                try:
                    await self.cycle()
                except Exception:  # counted in `timed`; a runner keeps going, as the real one does
                    await asyncio.sleep(IDLE_S)
        if self.agent is not None:
            await self.agent.close()

    async def cycle(self) -> None:
        store = self.store
        claim = await self.timed(lambda: store.dequeue(self.worker_id))
        if claim is None:
            await asyncio.sleep(IDLE_S)
            return
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
        writer = store
        if self.agent is not None:
            assert claim.agent_key, "the store minted no agent key (is its token set?)"
            self.agent._headers["Authorization"] = f"Bearer {claim.agent_key}"
            writer = self.agent
        await self.timed(store.get_latest_resources)
        await self.timed(lambda: store.start_attempt(aid))
        await self.timed(lambda: store.heartbeat(aid))
        for _ in range(SPAN_CALLS):
            await self.timed(lambda: writer.add_spans(_spans(rid, aid)))
        await self.timed(lambda: store.heartbeat(aid))
        await self.timed(lambda: store.finish_attempt(aid, AttemptStatus.SUCCEEDED, reward=1.0))
        self.cycles += 1


def _client(url: str, token: str | None, runner_id: str | None = None) -> Store:
    """A StoreClient with the token, and for a runner its id where StoreClient takes one (runner scopes)."""
    from alight.store.client import StoreClient

    takes = inspect.signature(StoreClient).parameters
    options = {"token": token, "runner_id": runner_id}
    return StoreClient(url, **{k: v for k, v in options.items() if v is not None and k in takes})


def _client_process(
    url: str, token: str | None, names: list[str], seconds: float, barrier: Any, out: Any, keys: bool = False
) -> None:
    latencies: array[float] = array("d")
    errors: list[str] = []
    if keys:
        runners = [
            _Runner(_client(url, credential), name, latencies, errors, agent=_client(url, "unset"))
            for name, credential in asyncio.run(_register(url, token, names))
        ]
    else:
        runners = [_Runner(_client(url, token, name), name, latencies, errors) for name in names]
    barrier.wait()

    async def run() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(runner.run(until) for runner in runners))

    asyncio.run(run())
    out.put((latencies.tobytes(), errors[:5], len(errors), sum(r.cycles for r in runners)))


async def _register(url: str, token: str | None, names: list[str]) -> list[tuple[str, str]]:
    """(name, runner credential) for each runner: what a pool does once at start (not timed)."""
    from alight.store.client import StoreClient

    async with StoreClient(url, token=token) as admin:
        return [(name, await admin.register_runner(name)) for name in names]


async def _feed(url: str, token: str | None, clients: int, until: float) -> None:
    """The algorithm's side: one resource set, then keep the queue at least 2 x clients deep."""
    async with _client(url, token) as store:
        await store.add_resources({"llm": LLMResource(endpoint="http://127.0.0.1:9/v1", model="tiny")})
        while time.monotonic() < until:
            queuing = (await store.count_by_status())[RolloutStatus.QUEUING]
            if queuing < 2 * clients:
                await store.enqueue([Rollout(task=Task(input={"i": i})) for i in range(2 * clients)])
            await asyncio.sleep(0.05)


def _memory_mb(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _check_token_support() -> None:
    from alight.cli.app import store as store_command
    from alight.store.client import StoreClient

    if "token" not in inspect.signature(StoreClient).parameters:
        raise SystemExit("--token: this alight's StoreClient takes no token yet (authentication has not landed)")
    if "token" not in inspect.signature(store_command).parameters:
        raise SystemExit("--token: this alight's `alight store` takes no --token yet (authentication has not landed)")


def _start_server(db: Path, token: str | None, agent_spans: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [sys.executable, "-m", "alight", "store", "--db", str(db), "--port", str(port)]
    command += ["--agent-spans"] if agent_spans else []
    env = dict(os.environ)
    env.pop("ALIGHT_TOKEN", None)
    if token is not None:
        env["ALIGHT_TOKEN"] = token  # what --token reads by default; kept out of `ps`
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit(f"alight store did not come up at {url}")
        time.sleep(0.1)


def measure(
    seconds: float, clients: int, processes: int, token: str | None, workdir: Path, keys: bool = False, case: str = ""
) -> list[dict[str, Any]]:
    workdir.mkdir(parents=True, exist_ok=True)
    server, url = _start_server(workdir / "store.db", token, agent_spans=keys)
    try:
        ctx = mp.get_context("spawn")
        processes = max(1, min(processes, clients))
        barrier, out = ctx.Barrier(processes + 1), ctx.Queue()
        names = [f"runner-{i}" for i in range(clients)]
        procs = [
            ctx.Process(target=_client_process, args=(url, token, names[i::processes], seconds, barrier, out, keys))
            for i in range(processes)
        ]
        for proc in procs:
            proc.start()
        barrier.wait()
        started = time.monotonic()
        asyncio.run(_feed(url, token, clients, started + seconds))
        reports = [out.get(timeout=seconds + 300) for _ in procs]
        elapsed = time.monotonic() - started
        for proc in procs:
            proc.join(timeout=30)
        rss_mb, peak_mb = _memory_mb(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    latencies: array[float] = array("d")
    for raw, *_ in reports:
        latencies.frombytes(raw)
    errors = sum(report[2] for report in reports)
    for message in {m for report in reports for m in report[1]}:
        print(f"error: {message}", file=sys.stderr)
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    case = f"{clients}_clients{case}"
    values = {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": cuts[49] * 1000,
        "p99_ms": cuts[98] * 1000,
        "errors": float(errors),
        "rollout_cycles_per_s": sum(report[3] for report in reports) / elapsed,
        "server_rss_mb": rss_mb,
        "server_peak_rss_mb": peak_mb,
    }
    return [{"case": case, "metric": metric, "value": round(value, 2)} for metric, value in values.items()]


def _value(rows: list[dict[str, Any]], metric: str) -> float:
    return float(next(row["value"] for row in rows if row["metric"] == metric))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the runners run")
    parser.add_argument("--clients", type=int, default=64, help="concurrent runner clients")
    parser.add_argument("--processes", type=int, default=4, help="client processes the runners are spread over")
    parser.add_argument("--token", default=None, help="the store's token (server and clients); see above")
    parser.add_argument("--keys", default=None, metavar="T", help="shared token T vs per-attempt keys; see above")
    args = parser.parse_args()
    if args.token is not None:
        _check_token_support()
    with tempfile.TemporaryDirectory(prefix="alight-load-bench-") as tmp:
        if args.keys is None:
            results = measure(args.seconds, args.clients, args.processes, args.token, Path(tmp))
        else:
            shared = measure(
                args.seconds, args.clients, args.processes, args.keys, Path(tmp) / "a", case="_shared_token"
            )
            keyed = measure(
                args.seconds,
                args.clients,
                args.processes,
                args.keys,
                Path(tmp) / "b",
                keys=True,
                case="_per_attempt_keys",
            )
            ratio = _value(keyed, "requests_per_s") / _value(shared, "requests_per_s")
            case = f"{args.clients}_clients_per_attempt_keys"
            results = [*shared, *keyed, {"case": case, "metric": "overhead_ratio", "value": round(ratio, 3)}]
    title = f"{args.clients} runner clients in {args.processes} processes, {args.seconds:g} s, one store server"
    emit("load", results, as_json=args.json, title=title, digits=2)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
