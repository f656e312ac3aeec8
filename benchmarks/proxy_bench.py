"""LLM proxy overhead and embedded-engine batching.

Cases:
  proxy     Latency the proxy adds to one chat call. Both sides serve the SAME kind of engine (the
            embedded tiny model, max_tokens=1, greedy, no batching wait) from the same kind of
            server (uvicorn + httptools in a thread of this process) to the same client (one
            keep-alive httpx connection, sequential calls):
              bare   a minimal OpenAI-compatible route: parse JSON, call engine.chat, answer JSON;
              proxy  alight's proxy on /rollout/{rid}/attempt/{aid}/v1: pydantic validation, the
                     weight gate, the OpenAI response, and one LLM span (token ids, log-probs)
                     written to an in-process MemoryStore after the answer.
            That is what "calling the engine directly" means here: the transport is the same,
            so the difference is what the proxy itself does. Calls alternate between the two
            (drift on a shared machine hits both); added_p50_ms / added_p99_ms are the
            differences of the percentiles. An in-process `await engine.chat` is reported too
            (inprocess_p50_ms), to show what any HTTP hop costs on top.
  embedded  Embedded engine throughput (in process, tiny model, 32 new tokens per request at
            temperature 1): sequential requests vs 8 concurrent ones, which the engine batches.
            Metrics tokens_per_s_1, tokens_per_s_8 and batching_gain (their ratio).
  staggered Continuous batching: 8 concurrent clients whose requests ask for 4 to 60 new tokens
            (a seeded draw), so rows end at different times; the engine with static batches (each
            runs to its end while new requests wait) then with continuous batching (requests join
            between two tokens). Metrics tokens_per_s_static, tokens_per_s_continuous,
            continuous_gain (their ratio) and the median request latency of each.
  uniform   The same with every request asking for 32 new tokens: bursts of clients that come back
            together, which continuous batching must take in groups (one prefill, one merge) to
            keep up with static batches. Same metrics.
            In both, the two modes alternate which runs first from one repeat to the next (A/B).

Each case runs --repeat times; every value is the median over the runs, since timings on a shared
2-core machine vary a lot from run to run (each run's value goes to stderr, with --json too).

Usage: python benchmarks/proxy_bench.py [--json] [--calls 300] [--seconds 10] [--repeat 3]
       [--cases proxy,embedded,staggered,uniform]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bench_report import arguments, emit, median_row

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextlib.contextmanager
def _bare_server(engine: Any) -> Iterator[str]:
    """The baseline: the engine behind one bare OpenAI-compatible route, no spans, no validation."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from alight.engines.base import ChatRequest, SamplingParams
    from alight.serving import BackgroundServer

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        sampling = SamplingParams(temperature=body.get("temperature", 1.0), max_tokens=body.get("max_tokens"))
        generation = await engine.chat(ChatRequest(model=body["model"], messages=body["messages"], sampling=sampling))
        answer = {
            "id": "chatcmpl-bare",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": generation.model,
            "choices": [{"index": 0, "message": generation.message, "finish_reason": generation.finish_reason}],
            "usage": {"prompt_tokens": generation.prompt_tokens, "completion_tokens": generation.completion_tokens},
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    class BareServer(BackgroundServer):  # served exactly as ProxyServer is: uvloop, httptools, a thread
        what = "bare server"

        async def before_serving(self) -> None:
            await engine.start()

        async def after_serving(self) -> None:
            await engine.close()

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)]
    with BareServer(Starlette(routes=routes), host="127.0.0.1", port=0) as server:
        yield f"{server.url}/v1"


def _engine(tiny: Path, **options: Any) -> Any:
    from alight.engines.embedded import EmbeddedEngine

    return EmbeddedEngine("tiny", cache_dir=tiny, **options)


def measure_proxy(tiny: Path, calls: int) -> list[dict[str, Any]]:
    import httpx

    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore
    from alight.types import Rollout, Task

    body = {"model": "tiny", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 1}
    body["temperature"] = 0
    store = MemoryStore()
    with (
        ProxyServer(Proxy(_engine(tiny, batch_wait_ms=0), store)) as proxy,
        _bare_server(_engine(tiny, batch_wait_ms=0)) as bare_url,
        httpx.Client(trust_env=False, timeout=60) as http,
    ):

        async def claim() -> tuple[str, str]:
            await store.enqueue([Rollout(rollout_id="ro-bench", task=Task(input=0))])
            got = await store.dequeue("bench")
            assert got is not None
            return got.rollout.rollout_id, got.attempt.attempt_id

        rid, aid = proxy.run(claim())
        urls = {"bare": bare_url + "/chat/completions", "proxy": proxy.base_url(rid, aid) + "/chat/completions"}
        times: dict[str, list[float]] = {"bare": [], "proxy": []}
        for i in range(calls + 20):  # the first 20 warm up both sides
            for side in ("bare", "proxy") if i % 2 else ("proxy", "bare"):
                started = time.perf_counter()
                response = http.post(
                    urls[side], content=orjson.dumps(body), headers={"content-type": "application/json"}
                )
                elapsed = time.perf_counter() - started
                assert response.status_code == 200, response.text
                if i >= 20:
                    times[side].append(1000 * elapsed)
        proxy.flush()
        recorded = len(proxy.run(store.query_spans(rid)))
        assert recorded == calls + 20, f"{recorded} spans for {calls + 20} calls"

    async def inprocess() -> list[float]:
        from alight.engines.base import ChatRequest, SamplingParams

        engine = _engine(tiny, batch_wait_ms=0)
        await engine.start()
        request = ChatRequest(model="tiny", messages=body["messages"], sampling=SamplingParams(0.0, max_tokens=1))
        out = []
        for i in range(calls + 20):
            started = time.perf_counter()
            await engine.chat(request)
            if i >= 20:
                out.append(1000 * (time.perf_counter() - started))
        await engine.close()
        return out

    direct = asyncio.run(inprocess())
    p50 = {side: statistics.median(values) for side, values in times.items()}
    p99 = {side: _percentile(values, 0.99) for side, values in times.items()}
    return [
        {"case": "proxy", "metric": "added_p50_ms", "value": round(p50["proxy"] - p50["bare"], 3)},
        {"case": "proxy", "metric": "added_p99_ms", "value": round(p99["proxy"] - p99["bare"], 3)},
        {"case": "proxy", "metric": "proxy_p50_ms", "value": round(p50["proxy"], 3)},
        {"case": "proxy", "metric": "bare_p50_ms", "value": round(p50["bare"], 3)},
        {"case": "proxy", "metric": "inprocess_p50_ms", "value": round(statistics.median(direct), 3)},
    ]


async def _throughput(
    tiny: Path, seconds: float, concurrency: int, *, continuous: bool = True, varied: bool = False
) -> tuple[float, float]:
    """Tokens per second of `concurrency` clients calling the engine back to back for `seconds`,
    and the median request latency (ms). Each request asks for 32 new tokens, or with `varied` for
    4 to 60 (a fixed draw per client and request), so that rows end at different times."""
    import random

    from alight.engines.base import ChatRequest, SamplingParams

    engine = _engine(tiny, max_batch_size=8, batch_wait_ms=2.0, continuous_batching=continuous)
    await engine.start()
    tokens = 0
    latencies: list[float] = []

    async def worker(index: int, until: float) -> None:
        nonlocal tokens
        draw = random.Random(index)
        n = 0
        while time.monotonic() < until:
            wanted = draw.randrange(4, 61) if varied else 32
            sampling = SamplingParams(temperature=1.0, max_tokens=wanted, seed=index * 100_000 + n)
            messages = [{"role": "user", "content": f"Tell me a story number {n}."}]
            started = time.monotonic()
            generation = await engine.chat(ChatRequest(model="tiny", messages=messages, sampling=sampling))
            latencies.append(1000 * (time.monotonic() - started))
            tokens += generation.completion_tokens  # not `tokens += await ...`: that loses updates
            n += 1

    await worker(-1, time.monotonic() + 1.0)  # warm up
    tokens, latencies = 0, []
    started = time.monotonic()
    await asyncio.gather(*(worker(i, started + seconds) for i in range(concurrency)))
    rate = tokens / (time.monotonic() - started)
    await engine.close()
    return rate, statistics.median(latencies)


def measure_embedded(tiny: Path, seconds: float) -> list[dict[str, Any]]:
    (one, _), (eight, _) = asyncio.run(_throughput(tiny, seconds, 1)), asyncio.run(_throughput(tiny, seconds, 8))
    return [
        {"case": "embedded", "metric": "tokens_per_s_1", "value": round(one, 1)},
        {"case": "embedded", "metric": "tokens_per_s_8", "value": round(eight, 1)},
        {"case": "embedded", "metric": "batching_gain", "value": round(eight / one, 2)},
    ]


def _static_vs_continuous(tiny: Path, seconds: float, case: str, *, varied: bool) -> list[dict[str, Any]]:
    """8 clients against static then continuous batches, or the other way round every other call."""
    first_static = next(_AB) % 2 == 0
    measured: dict[bool, tuple[float, float]] = {}
    for continuous in (False, True) if first_static else (True, False):
        measured[continuous] = asyncio.run(_throughput(tiny, seconds, 8, continuous=continuous, varied=varied))
    (static, static_ms), (cont, cont_ms) = measured[False], measured[True]
    return [
        {"case": case, "metric": "tokens_per_s_static", "value": round(static, 1)},
        {"case": case, "metric": "tokens_per_s_continuous", "value": round(cont, 1)},
        {"case": case, "metric": "continuous_gain", "value": round(cont / static, 3)},
        {"case": case, "metric": "latency_p50_ms_static", "value": round(static_ms, 1)},
        {"case": case, "metric": "latency_p50_ms_continuous", "value": round(cont_ms, 1)},
    ]


_AB = itertools.count()  # which mode runs first alternates from one call to the next


def measure_staggered(tiny: Path, seconds: float) -> list[dict[str, Any]]:
    return _static_vs_continuous(tiny, seconds, "staggered", varied=True)


def measure_uniform(tiny: Path, seconds: float) -> list[dict[str, Any]]:
    return _static_vs_continuous(tiny, seconds, "uniform", varied=False)


MEASURES = {
    "proxy": None,
    "embedded": measure_embedded,
    "staggered": measure_staggered,
    "uniform": measure_uniform,
}


def main() -> None:
    parser = arguments(__doc__, cases="proxy,embedded,staggered,uniform", repeat=3)
    parser.add_argument("--calls", type=int, default=300, help="calls per side (proxy case)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per concurrency (embedded case)")
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)  # model-loading chatter would spoil --json
    from alight.models.resolve import tiny_model_dir

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="alight-proxy-bench-") as tmp:
        tiny = tiny_model_dir(Path(tmp) / "tiny")
        for case in args.cases.split(","):
            if case not in MEASURES:
                raise SystemExit(f"unknown case {case!r} (choose from {', '.join(MEASURES)})")
            measure = MEASURES[case]
            runs = [
                measure_proxy(tiny, args.calls) if measure is None else measure(tiny, args.seconds)
                for _ in range(args.repeat)
            ]
            for rows in zip(*runs, strict=True):
                values = [row["value"] for row in rows]
                results.append(median_row(case, rows[0]["metric"], values, digits=3))  # each run on stderr
    title = f"{args.calls} calls per side; embedded: {args.seconds:g} s per concurrency; median of {args.repeat}"
    emit("proxy", results, as_json=args.json, title=title, digits=3)


if __name__ == "__main__":
    main()
