"""`alight eval`: one or more models on the same tasks, `n` samples each, through the full stack
(store, proxy, engine, runners), each model in turn; then the mean reward with its bootstrap
interval, pass@k, and, from the second model on, the paired difference against the first
(`alight.algorithms.evaluation`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alight.algorithms.evaluation import Difference, Interval, bootstrap_mean, mean_pass_at_k, paired_bootstrap
from alight.commands.dev import served_model, with_endpoint, with_temperature
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer.tasks import DevResult, dev_rows

#: Keys a task row is named by in the per-task results, first found wins (SWE-bench, Calc-X, ours).
TASK_NAME_KEYS = ("instance_id", "id", "task_id", "name")


@dataclass
class EvalModel:
    """One `--model` and what it did: per task, its `n` rewards (a failed rollout counts 0)."""

    label: str  # as the user gave it (or the config's model), unique within the report
    endpoint: str | None  # an OpenAI-compatible base URL the engine is swapped for (LiteLLM)
    name: str | None  # what --model named at the endpoint, or for the configured engine
    served: str = ""  # what the engine served: a resolved checkpoint directory, a LiteLLM model
    run_dir: Path | None = None  # where this model's store is kept (`alight trace` reads it)
    rewards: list[list[float]] = field(default_factory=list)
    failed: int = 0  # rollouts that did not succeed (scored 0)
    errors: list[str] = field(default_factory=list)  # their last error lines, first few
    mean: Interval | None = None
    pass_at_k: dict[int, float] = field(default_factory=dict)
    difference: Difference | None = None  # against the first model; None for the first
    elapsed_s: float = 0.0


@dataclass
class EvalReport:
    """What `run_eval` measured, with the settings that decide how to read it."""

    run_dir: Path
    source: str  # the split name, or the task file
    tasks: list[Any]
    names: list[str]  # one short name per task (see TASK_NAME_KEYS), for tables
    n: int
    ks: list[int]
    temperature: float
    success: float
    seed: int
    resamples: int
    confidence: float
    models: list[EvalModel]


def parse_model(spec: str) -> tuple[str | None, str | None]:
    """`--model` as (endpoint, model): `http(s)://host/v1` is an OpenAI-compatible endpoint serving
    the config's `engine.served_name`, `NAME@http(s)://host/v1` one serving NAME (a LiteLLM model
    string works too); anything else is a model for the configured engine (a model directory, a
    checkpoint, a training run directory, or a LiteLLM model string for a litellm engine)."""
    if spec.startswith(("http://", "https://")):
        return spec, None
    for scheme in ("@http://", "@https://"):
        if scheme in spec:
            name, _, rest = spec.partition(scheme)
            if not name:
                raise ConfigError(f"--model {spec!r}: name the model before '@'")
            return scheme[1:] + rest, name
    return None, spec


def parse_ks(text: str | None, n: int) -> list[int]:
    """`--k 1,4` as sorted unique ks, each 1..n (default: 1 and n)."""
    if text is None:
        return sorted({1, n})
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"--k {text!r}: give whole numbers separated by commas, such as 1,4") from None
    if not ks:
        raise ConfigError("--k names no k")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ConfigError(f"--k {bad[0]}: pass@k needs 1 <= k <= n samples per task (--n {n})")
    return ks


def eval_tasks(cfg: ExperimentConfig, split: str | None, tasks_file: Path | None) -> tuple[str, list[Any]]:
    """The tasks to evaluate on: every row of a task file (as `data.*` reads files), or every row of
    the split as training validates on it (`dev_rows`; default the config's dev.split)."""
    from alight.data import load_rows, task_input

    if tasks_file is not None:
        if split is not None:
            raise ConfigError("give --split or --tasks, not both")
        if not tasks_file.exists():
            raise ConfigError(f"--tasks {tasks_file}: no such file")
        rows = load_rows(str(tasks_file))
        source, tasks = str(tasks_file), [task_input(row, cfg.data.input_field) for row in rows]
    else:
        source, tasks = dev_rows(cfg, None, split)
    if not tasks:
        raise ConfigError(f"no tasks to evaluate in {source}")
    return source, tasks


def task_name(task: Any, index: int) -> str:
    """A short name for a task: its id field when it has one, else its position."""
    if isinstance(task, dict):
        for key in TASK_NAME_KEYS:
            if isinstance(task.get(key), str | int):
                return str(task[key])
    return f"#{index}"


def prepare_models(cfg: ExperimentConfig, specs: list[str]) -> list[EvalModel]:
    """Each `--model` parsed and resolved (a missing path fails here, in one line, before anything
    runs); without one, the config's own engine and model."""
    if not specs:
        return [EvalModel(label=cfg.engine.model, endpoint=None, name=None, served=cfg.engine.model)]
    models: list[EvalModel] = []
    seen: set[str] = set()
    for spec in specs:
        endpoint, name = parse_model(spec)
        label = spec if spec not in seen else f"{spec} ({len(models) + 1})"
        seen.add(label)
        model = EvalModel(label=label, endpoint=endpoint, name=name)
        model.served = _config_for(cfg, model).engine.model if endpoint else served_model(cfg, spec)
        models.append(model)
    return models


def _config_for(cfg: ExperimentConfig, model: EvalModel) -> ExperimentConfig:
    return with_endpoint(cfg, model.endpoint, model.name)


def run_eval(
    cfg: ExperimentConfig,
    models: list[str],
    *,
    split: str | None = None,
    tasks_file: Path | None = None,
    n: int = 1,
    k: str | None = None,
    temperature: float | None = None,
    success: float = 1.0,
    seed: int = 0,
    resamples: int = 2000,
    confidence: float = 0.95,
    run_dir: Path | None = None,
    on_progress: Callable[[EvalModel, int, int], None] | None = None,
) -> EvalReport:
    """Evaluate each of `models` (see `parse_model`; none: the config's) on every task of `split`
    or `tasks_file`, `n` rollouts per task at `temperature` (default the config's), one model after
    another, each in its own stack and store under `run_dir` (default
    `{output_dir}/{name}-eval-{timestamp}`, a `model-{i}` directory per model). A rollout scores
    its reward, 0 when it failed; a task's sample succeeds at reward >= `success`.
    `on_progress(model, ended, total)` follows the rollouts. Every input problem raises a
    one-line ConfigError before a worker starts."""
    from alight.trainer.checks import validate
    from alight.trainer.run_dir import new_run_dir
    from alight.trainer.stack import check_endpoint

    if n < 1:
        raise ConfigError(f"--n must be 1 or more, not {n}")
    if resamples < 1:
        raise ConfigError(f"--resamples must be 1 or more, not {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"--confidence must be between 0 and 1, not {confidence}")
    ks = parse_ks(k, n)
    cfg = with_temperature(cfg, temperature)
    if n > 1 and cfg.engine.sampling.temperature == 0:
        raise ConfigError(f"--n {n} samples per task at temperature 0 are all the same answer: give --temperature > 0")
    own_engine = not models or any(parse_model(spec)[0] is None for spec in models)  # not only endpoints
    validate(cfg, training=False, engine=own_engine)  # once, before a worker starts
    source, tasks = eval_tasks(cfg, split, tasks_file)
    chosen = prepare_models(cfg, models)
    for model in chosen:
        if model.endpoint is not None:
            check_endpoint(model.endpoint)
    run_dir = run_dir or new_run_dir(cfg, "eval")
    for index, model in enumerate(chosen):
        _evaluate(_config_for(cfg, model), model, run_dir / f"model-{index + 1}", tasks, n, success, on_progress)
    report = EvalReport(
        run_dir=run_dir, source=source, tasks=tasks, names=[task_name(t, i) for i, t in enumerate(tasks)], n=n,
        ks=ks, temperature=cfg.engine.sampling.temperature, success=success, seed=seed, resamples=resamples,
        confidence=confidence, models=chosen,
    )  # fmt: skip
    score(report)
    return report


def _evaluate(
    cfg: ExperimentConfig,
    model: EvalModel,
    run_dir: Path,
    tasks: list[Any],
    n: int,
    success: float,
    on_progress: Callable[[EvalModel, int, int], None] | None,
) -> None:
    from alight.trainer.tasks import run_on_stack

    started = time.monotonic()
    model.run_dir = run_dir

    def progress(counts: dict[str, int]) -> None:
        if on_progress is not None:
            on_progress(model, counts["ended"], counts["total"])

    repeated = [task for task in tasks for _ in range(n)]  # task i's samples are rollouts i*n .. i*n+n-1
    results = run_on_stack(cfg, run_dir, model.served, repeated, progress)
    model.rewards = [[_reward(r) for r in results[i * n : (i + 1) * n]] for i in range(len(tasks))]
    failed = [r for r in results if r.status != "succeeded"]
    model.failed = len(failed)
    model.errors = [f"{r.status}: {r.error}" if r.error else r.status for r in failed[:5]]
    model.elapsed_s = time.monotonic() - started


def _reward(result: DevResult) -> float:
    """A rollout's score: its reward, 0 when it failed or gave none."""
    return float(result.reward or 0.0) if result.status == "succeeded" else 0.0


def score(report: EvalReport) -> None:
    """Fill in each model's statistics from its rewards: the mean over tasks of each task's mean
    reward with its bootstrap interval, pass@k, and the paired difference against the first model."""
    first = report.models[0]
    for model in report.models:
        per_task = [sum(samples) / len(samples) for samples in model.rewards]
        model.mean = bootstrap_mean(
            per_task, resamples=report.resamples, confidence=report.confidence, seed=report.seed
        )
        successes = [sum(1 for reward in samples if reward >= report.success) for samples in model.rewards]
        model.pass_at_k = {k: mean_pass_at_k(successes, report.n, k) for k in report.ks}
        if model is not first:
            baseline = [sum(samples) / len(samples) for samples in first.rewards]
            model.difference = paired_bootstrap(
                baseline, per_task, resamples=report.resamples, confidence=report.confidence, seed=report.seed
            )


def report_json(report: EvalReport) -> dict[str, Any]:
    """The report as one JSON-ready object: settings, each model's statistics, per-task rewards."""
    models = []
    for model in report.models:
        row: dict[str, Any] = {
            "label": model.label,
            "model": model.served,
            "endpoint": model.endpoint,
            "run_dir": str(model.run_dir),
            "rollouts": report.n * len(report.tasks),
            "failed": model.failed,
            "errors": model.errors,
            "mean_reward": dataclasses.asdict(model.mean) if model.mean else None,
            "pass_at_k": {str(k): v for k, v in model.pass_at_k.items()},
            "difference": dataclasses.asdict(model.difference) if model.difference else None,
            "elapsed_s": round(model.elapsed_s, 3),
        }
        models.append(row)
    per_task = [
        {"name": name, "task": task, "rewards": {m.label: m.rewards[i] for m in report.models}}
        for i, (name, task) in enumerate(zip(report.names, report.tasks, strict=True))
    ]
    return {
        "run_dir": str(report.run_dir),
        "source": report.source,
        "tasks": len(report.tasks),
        "n": report.n,
        "k": report.ks,
        "temperature": report.temperature,
        "success": report.success,
        "seed": report.seed,
        "resamples": report.resamples,
        "confidence": report.confidence,
        "baseline": report.models[0].label,
        "models": models,
        "per_task": per_task,
    }
