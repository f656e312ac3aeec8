"""How close one RL update of a real model comes to what this CPU can do, and what each lever gives.

One GRPO update of the embedded backend on a calc_smol-sized batch: `--groups` GRPO groups of
`--group-size` rows, each group one calculator prompt as calc_smol renders it (SmolLM2's ChatML tool
template, ~120 tokens) and responses of 16 to `--response-tokens` tokens, micro-batches of the whole
batch. Every case runs in a process of its own (threads are set before torch starts), `--repeat`
updates after one warm-up update, the median reported:

  base       fp32, one thread, every row's prompt computed (the update before issue 46)
  threads    base with every usable core (a sync update runs alone: trainer.threads.ThreadPolicy)
  bf16       base with algorithm.precision=bf16 (autocast; fp32 weights, optimizer, output layer)
  share      base with algorithm.share_prompts (a group's prompt computed once)
  all        the three together (what calc_smol runs with now)

Rows per case: `update_s`; `tflops` executed (model FLOPs of the tokens the case computes:
6 x the decoder's weights per token in the decoder, 6 x the output layer's per response token,
attention left out) per second; `ceiling_tflops`, the bare matrix product at the same dtype and
threads, measured in the same process just before (a [tokens x 576] @ [576 x 1536] product, the
model's MLP shape); `ceiling_fraction` (tflops / ceiling_tflops); `speedup` (base's update_s / the
case's). Case `fidelity` compares bf16 with fp32 on the same batch and weights: the loss's relative
difference, the log-probs' largest difference and the gradients' cosine.

Usage: python benchmarks/update_bench.py [--json] [--cases base,threads,bf16,share,all,fidelity] [--repeat 3]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_report import Row, arguments, emit

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
CASES = {  # threads (0: every usable core), precision, share_prompts
    "base": (1, "fp32", False),
    "threads": (0, "fp32", False),
    "bf16": (1, "bf16", False),
    "share": (1, "fp32", True),
    "all": (0, "bf16", True),
}


def calc_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """`n` calculator prompts as calc_smol's agent sends them (the tool in SmolLM2's tool template)."""
    sys.path.insert(0, str(REPO))
    from recipes.calc.agent import CALCULATE_TOOL
    from recipes.calc.data import make_problems

    prompts = []
    for problem in make_problems(n, seed=1):
        messages = [{"role": "user", "content": problem["question"]}]
        text = tokenizer.apply_chat_template(
            messages, tools=[CALCULATE_TOOL], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def build(args: Any, threads: int, precision: str, share: bool) -> tuple[Any, Any]:
    import torch

    from alight.algorithms.batch import TransitionBatch
    from alight.backends.embedded import EmbeddedBackend
    from alight.config.schema import AlgorithmConfig
    from alight.models.chat_templates import load_tokenizer
    from alight.models.sources import prepare_model
    from alight.types import Transition

    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    path = prepare_model(MODEL)
    tokenizer = load_tokenizer(path, "auto")
    g = torch.Generator().manual_seed(0)
    rows = []
    for group, prompt in enumerate(calc_prompts(tokenizer, args.groups)):
        for i in range(args.group_size):
            length = int(torch.randint(16, args.response_tokens + 1, (), generator=g))
            response = torch.randint(3, 49000, (length,), generator=g).tolist()
            advantage = float(torch.randn((), generator=g))
            rows.append(
                Transition.unchecked(prompt, response, 1.0, f"r{group}-{i}", group_id=str(group), advantage=advantage)
            )
    batch = TransitionBatch.from_transitions(rows, int(tokenizer.pad_token_id or 0))
    algorithm = AlgorithmConfig(lr=1e-6, micro_batch_size=len(rows), precision=precision, share_prompts=share)
    return EmbeddedBackend(path, algorithm, seed=0), batch


def model_flops(backend: Any, batch: Any, share: bool) -> float:
    """Forward + backward FLOPs of the tokens the update computes (see the module docstring)."""
    from alight.backends.shared_prompt import prompt_groups

    model = backend.model
    head = model.get_output_embeddings().weight.numel()
    decoder = sum(p.numel() for p in model.get_decoder().parameters()) - model.get_input_embeddings().weight.numel()
    groups = prompt_groups(batch) if share else None
    prompt_rows = len(groups[0]) if groups is not None else len(batch)
    tokens = prompt_rows * batch.prompt_length + len(batch) * batch.response_length  # padded, as computed
    return 6.0 * (decoder * tokens + head * float(batch.response_mask.sum()))


def ceiling(dtype_name: str, tokens: int, repeat: int = 5) -> float:
    """TFLOP/s of a bare [tokens x 576] @ [576 x 1536] product at this dtype and thread count."""
    import torch

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    a, b = torch.randn(tokens, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    a @ b  # warm-up
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(10):
            a @ b
        runs.append(10 * 2 * tokens * 576 * 1536 / (time.perf_counter() - started) / 1e12)
    return statistics.median(runs)


def run_case(args: Any, case: str) -> dict[str, float]:
    """In a child process: one case's figures."""
    threads, precision, share = CASES[case]
    backend, batch = build(args, threads, precision, share)
    top = ceiling(precision, batch.input_ids.numel())
    backend.update(batch.select(list(range(len(batch)))))  # warm-up (first-call allocations)
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        backend.update(batch.select(list(range(len(batch)))))
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    flops = model_flops(backend, batch, share) / seconds / 1e12
    return {"update_s": seconds, "tflops": flops, "ceiling_tflops": top, "ceiling_fraction": flops / top}


def fidelity(args: Any) -> dict[str, float]:
    """bf16 against fp32 on the same batch and weights: loss, log-probs, gradient direction."""
    import torch

    out = {}
    for precision in ("fp32", "bf16"):
        backend, batch = build(args, 0, precision, True)
        lp, _ = backend.log_probs(batch)
        mask = batch.response_mask
        loss = -(lp * batch.advantages).sum() / mask.sum()
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None])
        out[precision] = (lp.detach(), float(loss), grad, mask.bool())
    (lp32, loss32, g32, mask), (lp16, loss16, g16, _) = out["fp32"], out["bf16"]
    return {
        "loss_rel_diff": abs(loss16 - loss32) / abs(loss32),
        "log_prob_max_diff": float((lp16 - lp32)[mask].abs().max()),
        "log_prob_mean_diff": float((lp16 - lp32)[mask].abs().mean()),
        "grad_cosine": float(torch.nn.functional.cosine_similarity(g16.double(), g32.double(), dim=0)),
    }


def main() -> None:
    parser = arguments(__doc__, cases="base,threads,bf16,share,all,fidelity", repeat=3)
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups (distinct prompts) in the batch")
    parser.add_argument("--group-size", type=int, default=8, help="rows per group")
    parser.add_argument("--response-tokens", type=int, default=48, help="longest response")
    parser.add_argument("--child", help=argparse_hidden())
    args = parser.parse_args()
    if args.child:
        result = fidelity(args) if args.child == "fidelity" else run_case(args, args.child)
        print(json.dumps(result))
        return
    results: list[Row] = []
    base_s = None
    for case in args.cases.split(","):
        if case not in CASES and case != "fidelity":
            raise SystemExit(f"unknown case {case!r}; choose from {', '.join([*CASES, 'fidelity'])}")
        threads = CASES[case][0] if case in CASES else 0
        env = {
            **os.environ,
            "OMP_WAIT_POLICY": "PASSIVE",
            "OMP_NUM_THREADS": str(threads or len(os.sched_getaffinity(0))),
        }
        cmd = [sys.executable, __file__, "--child", case, *child_args(args)]
        print(f"+ {case}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(f"{case} failed: {done.stderr.strip()[-1500:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        if case == "base":
            base_s = figures["update_s"]
        if case in CASES and base_s is not None:
            figures["speedup"] = base_s / figures["update_s"]
        print(f"  {case}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()), file=sys.stderr, flush=True)
        results += [{"case": case, "metric": k, "value": round(v, 5)} for k, v in figures.items()]
    emit(
        "update",
        results,
        as_json=args.json,
        title=f"one GRPO update of {MODEL} on {os.cpu_count()} CPU cores",
        digits=3,
    )


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def child_args(args: Any) -> list[str]:
    return [
        "--repeat", str(args.repeat), "--groups", str(args.groups), "--group-size", str(args.group_size),
        "--response-tokens", str(args.response_tokens),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
