"""Running an experiment's tasks through the full stack without training: the run's store, proxy +
engine and runner pool (`run_on_stack`), on the rows of a split (`dev_rows`), checked first
(`run_tasks`). `Trainer.dev` runs it, and so do `alight dev` and `alight eval`
(`alight.commands`), which first turn their flags into the config and model it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class DevResult:
    """What one dev rollout did."""

    rollout_id: str
    task: Any
    status: str
    reward: float | None
    attempts: int
    llm_calls: int
    tool_calls: int
    duration_s: float | None
    error: str | None  # last line of the last failed attempt's error


@dataclass
class DevRun:
    """What `run_dev` did: where the run's store is kept, each rollout's result, the split the
    tasks came from and the model that answered."""

    run_dir: Path
    results: list[DevResult]
    elapsed_s: float
    split: str = ""
    model: str = ""

    @property
    def mean_reward(self) -> float | None:
        """The mean reward over every task, a rollout that failed or gave no reward counting as 0
        (so a model that crashes the agent scores lower, not higher); None without tasks."""
        if not self.results:
            return None
        return sum(r.reward or 0.0 for r in self.results) / len(self.results)

    @property
    def succeeded(self) -> int:
        return sum(1 for r in self.results if r.status == "succeeded")


SPLITS = ("train", "val")


def dev_rows(cfg: ExperimentConfig, n: int | None, split: str | None = None) -> tuple[str, list[Any]]:
    """The split and the task inputs dev runs: the first `n` rows of `split` (default `dev.split`,
    falling back to the other split when the config names only one), or with `n` None every row
    of the split, as training uses it (val: `data.val_size`, then `trainer.val_size`; train:
    `data.train_size`)."""
    from alight.data import load_rows, task_input

    specs = {"val": cfg.data.val, "train": cfg.data.train}
    if split is not None:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; choose train or val")
        if not specs[split]:
            raise ConfigError(f"the config names no {split} data (data.{split})")
        chosen: tuple[str, str | None] = (split, specs[split])
    else:
        order = [("val", cfg.data.val), ("train", cfg.data.train)]
        if cfg.dev.split != "val":
            order.reverse()
        chosen = next(((name, s) for name, s in order if s), ("", None))
    name, spec = chosen
    if spec is None:
        raise ConfigError("the config names no data (data.train or data.val)")
    size = n
    if n is None:
        size = cfg.data.val_size if name == "val" else cfg.data.train_size
    rows = load_rows(spec, size=size, seed=cfg.data.seed, generator_kwargs=cfg.data.generator_kwargs, split=name)
    if n is None and name == "val" and cfg.trainer.val_size is not None:
        rows = rows[: cfg.trainer.val_size]
    if n is not None:
        rows = rows[:n]
    return name, [task_input(row, cfg.data.input_field) for row in rows]


def run_tasks(
    cfg: ExperimentConfig,
    run_dir: Path | None = None,
    *,
    n: int | None = None,
    model: str | None = None,
    split: str | None = None,
    all_rows: bool = False,
    on_progress: Callable[[dict[str, int]], None] | None = None,
    prompt: str | None = None,
) -> DevRun:
    """Run the agent on `n` tasks (default `dev.n`) of `split` (see `dev_rows`), or on every task
    of the split with `all_rows` (`n` then unused), through store, proxy, engine serving `model`
    (default `engine.model`) and runner pool; the store stays in `run_dir` (default
    `{output_dir}/{name}-dev-{timestamp}`) for `alight trace`.
    `on_progress` gets the counts of ended rollouts. `prompt` (an APO run directory, a
    best_prompt.json or a text file) is published as the `algorithm.apo.resource` PromptTemplate
    agents read. Every input problem raises ConfigError before a worker starts."""
    from alight.trainer.checks import validate
    from alight.trainer.run_dir import new_run_dir

    started = time.monotonic()
    serving = cfg.engine.model if model is None else model
    count = None if all_rows else (n or cfg.dev.n)
    validate(cfg, training=False)  # once, before a worker starts
    extra: dict[str, Any] = {}
    if prompt is not None:
        from alight.algorithms.apo.record import load_prompt
        from alight.types import PromptTemplate

        extra[cfg.algorithm.apo.resource] = PromptTemplate(template=load_prompt(prompt))
    split_name, tasks = dev_rows(cfg, count, split)
    run_dir = run_dir or new_run_dir(cfg, "dev")
    results = run_on_stack(cfg, run_dir, serving, tasks, on_progress, extra)
    return DevRun(run_dir, results, time.monotonic() - started, split=split_name, model=serving)


def run_on_stack(
    cfg: ExperimentConfig,
    run_dir: Path,
    model: str,
    tasks: list[Any],
    on_progress: Callable[[dict[str, int]], None] | None = None,
    extra: dict[str, Any] | None = None,
) -> list[DevResult]:
    """Start store, proxy + engine serving `model` and runner pool in `run_dir`, run one dev rollout
    per entry of `tasks` (in order; a task listed twice runs twice), and return their results in
    the same order. `extra` resources are published beside the LLM."""
    from alight.engines.factory import engine_class
    from alight.models.progress import quiet_progress_bars
    from alight.trainer.stack import LocalStack, check_endpoint
    from alight.trainer.threads import ThreadPolicy

    threads = ThreadPolicy.from_config(cfg.trainer.torch_threads, cfg.trainer.torch_interop_threads, cfg.engine.device)
    engine = engine_class(cfg.engine.kind)
    endpoint = engine.endpoint(cfg.engine)
    if endpoint:
        check_endpoint(endpoint)
    quiet_progress_bars()
    if engine.capabilities.in_process:  # the engine runs in this process
        threads.apply()
    n_runners = min(cfg.runner.n_runners, len(tasks))
    with LocalStack(cfg, run_dir, model=model, n_runners=n_runners, extra_resources=extra) as stack:
        assert stack.store_url is not None
        return asyncio.run(_run(cfg, stack.store_url, tasks, on_progress))


async def _run(
    cfg: ExperimentConfig, store_url: str, tasks: list[Any], on_progress: Callable[[dict[str, int]], None] | None
) -> list[DevResult]:
    from alight.store.base import LATEST_ATTEMPT
    from alight.store.client import StoreClient
    from alight.types import Rollout, RolloutMode, RolloutStatus, SpanKind, Task

    async with StoreClient(store_url) as store:
        rollouts = [
            Rollout(
                task=Task(input=task),
                mode=RolloutMode.DEV,
                max_attempts=cfg.runner.max_attempts,
                timeout_s=cfg.runner.timeout_s,
                heartbeat_timeout_s=cfg.runner.heartbeat_timeout_s,
            )
            for task in tasks
        ]
        ids = [r.rollout_id for r in await store.enqueue(rollouts)]
        deadline = time.monotonic() + cfg.dev.timeout_s
        while True:
            ended = await store.wait_for_rollouts(ids, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            if on_progress is not None:
                on_progress({"ended": len(ended), "total": len(ids)})
            if len(ended) == len(ids) or time.monotonic() >= deadline:
                break
        finished = {r.rollout_id for r in ended}
        for rollout_id in ids:
            if rollout_id not in finished:  # out of time (dev.timeout_s): cancel, so runners move on
                logger.warning("dev: rollout %s still running after %.0f s: cancelled", rollout_id, cfg.dev.timeout_s)
                await store.finish_rollout(rollout_id, RolloutStatus.CANCELLED)
        results = []
        for rollout_id in ids:
            rollout = await store.get_rollout(rollout_id)
            spans = await store.query_spans(rollout_id, LATEST_ATTEMPT) if rollout.attempt_count else []
            attempts = await store.list_attempts(rollout_id)
            errors = [a.error for a in attempts if a.error]
            ends = [s.end_time for s in spans if s.end_time] + [rollout.ended_at or 0.0]
            results.append(
                DevResult(
                    rollout_id=rollout_id,
                    task=rollout.task.input,
                    status=rollout.status.value,
                    reward=rollout.reward,
                    attempts=rollout.attempt_count,
                    llm_calls=sum(1 for s in spans if s.kind == SpanKind.LLM),
                    tool_calls=sum(1 for s in spans if s.kind == SpanKind.TOOL),
                    duration_s=(max(ends) - rollout.started_at) if rollout.started_at and max(ends) else None,
                    error=errors[-1].strip().splitlines()[-1] if errors else None,
                )
            )
        return results
