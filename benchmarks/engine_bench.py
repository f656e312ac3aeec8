"""Both engines on one model in one run: the embedded engine (transformers, in process) and real vLLM
(its CPU build in .venv-vllm, or the interpreter --vllm-python names), tokens/s of chat answers at
1, 8 and 32 concurrent requests; with --rollout, the wall time of one calc_smol step's rollouts
(4 tasks x 8 samples through the real proxy and runners) on each.

    python benchmarks/engine_bench.py --model smollm2-135m-instruct --json

Each engine serves the same directory with the same chat template, at temperature 1 with fixed
`--max-tokens` answers (`ignore_eos`-free: answers that end early count the tokens they have). Then
`--parity` answers per engine are scored by the trainer's view (a plain fp32 transformers forward):
the mean and max |engine - trainer| log-prob per token.
Run it alone: the two cores are shared by the engine and the clients."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench_report import arguments, emit, median_row

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    f"What is {a} + {b}? Answer with the number." for a, b in zip(range(11, 99, 3), range(40, 7, -1), strict=False)
]


def _vllm_python(named: str | None) -> str:
    python = named or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        sys.exit(f"no vLLM interpreter at {python}: run README's test command or pass --vllm-python")
    return python


def _engine(kind: str, model: str, args: Any) -> Any:
    if kind == "embedded":
        from alight.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(model, served_name="policy", dtype=args.dtype, max_batch_size=32)
    from alight.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model, python=_vllm_python(args.vllm_python), served_name="policy", dtype=args.dtype,
                      kv_cache_gib=2)  # fmt: skip


async def _burst(engine: Any, concurrency: int, max_tokens: int) -> float:
    """Tokens/s of `concurrency` chat requests sent together."""
    from alight.engines.base import ChatRequest, SamplingParams

    requests = [
        ChatRequest(
            model="policy",
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i),
        )
        for i in range(concurrency)
    ]
    started = time.perf_counter()
    answers = await asyncio.gather(*(engine.chat(r) for r in requests))
    elapsed = time.perf_counter() - started
    return sum(a.completion_tokens for a in answers) / elapsed


def _reference(model: str) -> Any:
    """The trainer's view of the weights: a plain transformers forward in fp32."""
    from transformers import AutoModelForCausalLM

    from alight.models.resolve import resolve_model

    path = resolve_model(model)
    return AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()


async def _parity(engine: Any, reference: Any, samples: int) -> tuple[float, float]:
    """Mean and max |engine - trainer| log-prob over the tokens of `samples` sampled answers (T = 1)."""
    import torch

    from alight.engines.base import ChatRequest, SamplingParams

    gaps: list[float] = []
    for i in range(samples):
        request = ChatRequest(
            model="policy",
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            sampling=SamplingParams(temperature=1.0, max_tokens=32, seed=100 + i),
        )
        out = await engine.chat(request)
        prompt, response = out.prompt_token_ids, out.response_token_ids
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(response)[:, None]).flatten()
        gaps += (torch.tensor(out.response_logprobs) - want).abs().tolist()
    return sum(gaps) / len(gaps), max(gaps)


async def measure(kind: str, model: str, args: Any, reference: Any = None) -> list[dict[str, Any]]:
    engine = _engine(kind, model, args)
    started = time.perf_counter()
    await engine.start() if kind == "vllm" else await asyncio.to_thread(engine.load)
    rows = [median_row(kind, "start_s", [time.perf_counter() - started])]
    try:
        await _burst(engine, 2, 8)  # warm-up
        for concurrency in args.concurrency:
            runs = [await _burst(engine, concurrency, args.max_tokens) for _ in range(args.repeat)]
            rows.append(median_row(f"{kind}-{concurrency}", "tokens_per_s", runs))
        if reference is not None:
            mean, worst = await _parity(engine, reference, args.parity)
            rows.append({"case": f"{kind}-{args.dtype}", "metric": "logprob_gap_mean", "value": round(mean, 8)})
            rows.append({"case": f"{kind}-{args.dtype}", "metric": "logprob_gap_max", "value": round(worst, 8)})
    finally:
        await engine.close()
    return rows


def rollout_time(kind: str, args: Any) -> dict[str, Any]:
    """One calc_smol step's rollouts (no warm start, each engine in `--dtype`): `timing/rollout_s` of step 1."""
    import json
    import tempfile

    from alight.config import load_config, to_object
    from alight.trainer import Trainer

    dtype = f"{'engine' if kind == 'embedded' else '+engine.options'}.dtype={args.dtype}"
    overrides = [
        f"engine.kind={kind}", "warm_start.steps=0", dtype, "trainer.steps=1", "trainer.val_every=0",
        "trainer.save_every=0", "logging.dashboard=false",
        f"trainer.output_dir={tempfile.mkdtemp(prefix='engine-bench-')}",
    ]  # fmt: skip
    if kind == "vllm":
        overrides += [f"+engine.options.python={_vllm_python(args.vllm_python)}", "+engine.options.kv_cache_gib=2"]
    cfg = to_object(load_config(REPO / "configs" / "calc_smol.yaml", overrides))
    result = Trainer(cfg).fit()
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in lines if m["step"] == 1)
    return median_row(f"{kind}-{args.dtype}-calc_smol_step", "rollout_s", [step["timing/rollout_s"]])


def main() -> None:
    parser = arguments(__doc__, cases="embedded,vllm", repeat=3)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model spec both engines take")
    parser.add_argument("--dtype", default="bfloat16", help="both engines' dtype")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--vllm-python", default=None, help="the interpreter with vLLM (default: .venv-vllm)")
    parser.add_argument("--rollout", action="store_true", help="also time one calc_smol step's rollouts per engine")
    parser.add_argument("--parity", type=int, default=8, help="answers scored by the trainer's forward (0: none)")
    args = parser.parse_args()
    from alight.models.sources import prepare_model

    model = str(prepare_model(args.model)) if args.model != "tiny" else "tiny"
    cases = args.cases.split(",")
    results: list[dict[str, Any]] = []
    reference = _reference(model) if args.parity else None
    for kind in cases:
        results += asyncio.run(measure(kind, model, args, reference))
    for concurrency in args.concurrency:
        rows = {r["case"]: r["value"] for r in results}
        if f"embedded-{concurrency}" in rows and f"vllm-{concurrency}" in rows and rows[f"embedded-{concurrency}"]:
            ratio = rows[f"vllm-{concurrency}"] / rows[f"embedded-{concurrency}"]
            results.append({"case": f"vllm-{concurrency}", "metric": "speed_ratio", "value": round(ratio, 3)})
    if args.rollout:
        results += [rollout_time(kind, args) for kind in cases]
    emit("engine", results, as_json=args.json, title=f"embedded vs vLLM (CPU build) on {args.model}")


if __name__ == "__main__":
    main()
