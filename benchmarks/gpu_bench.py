"""Policy updates on a GPU: the embedded backend against verl's FSDP workers, and alight's overhead.

Cases, each on the same batches of synthetic transitions (random prompt and response tokens with
engine log-probs, groups of --group rows, GRPO advantages):
- `embedded_cuda`: `EmbeddedBackend.update` with trainer.device=cuda (`update_tokens_per_s`);
- `verl`: `VerlBackend.update` (verl's actor on Ray, one GPU) (`update_tokens_per_s`);
- `verl_bare`: verl's actor `update_actor` alone on the TensorDict alight's step sends it, built
  once beforehand (`step_ms`), beside `verl_step` (`step_ms`: `VerlBackend.update` on the same batch)
  and `alight_over_bare` (`overhead_ratio`: alight's step / the bare update; target under 1.10).
Each value is the median of --repeat runs after one warm-up update. The model is the tiny one
built locally unless --model names a Hugging Face model directory.

Usage: python benchmarks/gpu_bench.py [--json] [--repeat 5] [--model DIR] [--rows 64] [--group 8]
Exits with status 2 and a one-line message when there is no CUDA GPU (or verl is missing).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench_report import arguments, emit, median_row

CASES = "embedded_cuda,verl,verl_bare"


def transitions(rows: int, group: int, *, prompt_len: int, response_len: int, vocab: int, seed: int) -> list[Any]:
    import torch

    from alight.types import Transition

    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        p = prompt_len - int(torch.randint(0, prompt_len // 4 + 1, (1,), generator=generator))
        r = response_len - int(torch.randint(0, response_len // 4 + 1, (1,), generator=generator))
        reward = float(i % 2)
        out.append(
            Transition.unchecked(
                torch.randint(1, vocab, (p,), generator=generator).tolist(),
                torch.randint(1, vocab, (r,), generator=generator).tolist(),
                reward,
                f"ro-{i}",
                group_id=f"g{i // group}",
                advantage=reward - 0.5,
                response_logprobs=(-torch.rand(r, generator=generator) - 0.5).tolist(),
            )
        )
    return out


def timed(update: Any, batches: list[Any]) -> list[float]:
    """Seconds per update, one run per batch (CUDA synchronised around each)."""
    import torch

    runs = []
    for batch in batches:
        torch.cuda.synchronize()
        started = time.perf_counter()
        update(batch)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - started)
    return runs


def main() -> None:
    parser = arguments(__doc__, cases=CASES, repeat=5)
    parser.add_argument("--model", default=None, help="a Hugging Face model directory (default: the tiny model)")
    parser.add_argument("--rows", type=int, default=64, help="transitions per update")
    parser.add_argument("--group", type=int, default=8, help="rows per GRPO group")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=256)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA GPU on this machine; it measures GPU updates only", file=sys.stderr)
        sys.exit(2)
    cases = args.cases.split(",")
    if any(c.startswith("verl") for c in cases) and importlib.util.find_spec("verl") is None:
        print('gpu_bench: verl is not installed: pip install "alight[verl]"', file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from transformers import AutoConfig

    from alight.algorithms.batch import TransitionBatch
    from alight.config.schema import AlgorithmConfig, ExperimentConfig
    from alight.models.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    model_dir = Path(args.model) if args.model else work / "tiny"
    if not args.model:
        build_tiny_model(model_dir, seed=0)
    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    algorithm = AlgorithmConfig(lr=1e-6, micro_batch_size=8)

    def batch(seed: int) -> Any:
        rows = transitions(
            args.rows, args.group, prompt_len=args.prompt_len, response_len=args.response_len, vocab=vocab, seed=seed
        )
        return TransitionBatch.from_transitions(rows, 0)

    batches = [batch(seed) for seed in range(args.repeat + 1)]  # the first one warms up
    tokens = [float((b.prompt_lengths + b.response_lengths).sum()) for b in batches]
    results = []
    device = torch.cuda.get_device_name(0)

    if "embedded_cuda" in cases:
        from alight.backends.embedded import EmbeddedBackend

        embedded = EmbeddedBackend(model_dir, algorithm, device="cuda")
        runs = timed(embedded.update, batches)[1:]
        embedded.close()
        per_s = [n / s for n, s in zip(tokens[1:], runs, strict=True)]
        results.append(median_row("embedded_cuda", "update_tokens_per_s", per_s, show_runs=not args.json))

    if "verl" in cases or "verl_bare" in cases:
        from alight.backends.verl.backend import SEQUENCE_KEYS, VerlBackend
        from alight.backends.verl.batch import to_data_proto

        cfg = ExperimentConfig(algorithm=algorithm)
        cfg = replace(cfg, trainer=replace(cfg.trainer, backend="verl", device="cuda"))
        backend = VerlBackend.from_config(cfg, model_dir, work_dir=work / "verl")
        try:
            runs = timed(backend.update, batches)[1:]
            if "verl" in cases:
                per_s = [n / s for n, s in zip(tokens[1:], runs, strict=True)]
                results.append(median_row("verl", "update_tokens_per_s", per_s, show_runs=not args.json))
            if "verl_bare" in cases:
                bare_inputs = []
                for b in batches:  # what alight's step sends update_actor, built outside the timing
                    data = to_data_proto(b, temperature=backend.temperature)
                    mini, rows = backend._update_layout(len(b))
                    meta = {"global_batch_size": mini, "mini_batch_size": mini, "epochs": 1, "seed": 0}
                    meta.update(dataloader_kwargs={"shuffle": False}, calculate_entropy=True, compute_loss=True)
                    keys = (*SEQUENCE_KEYS, "old_log_probs", "advantages")
                    bare_inputs.append(backend._worker_input(data, keys, rows, meta, masked=True))
                bare = timed(backend.workers.actor.update_actor, bare_inputs)[1:]
                step = timed(backend.update, batches)[1:]
                results.append(median_row("verl_bare", "step_ms", [s * 1000 for s in bare], show_runs=not args.json))
                results.append(median_row("verl_step", "step_ms", [s * 1000 for s in step], show_runs=not args.json))
                ratios = [s / b for s, b in zip(step, bare, strict=True)]
                results.append(
                    median_row("alight_over_bare", "overhead_ratio", ratios, digits=3, show_runs=not args.json)
                )
        finally:
            backend.close()
    emit("gpu", results, as_json=args.json, title=f"{device}: median of {args.repeat} updates of {args.rows} rows")


if __name__ == "__main__":
    main()
