"""`alight dev`: its flags turned into the config and model it runs (an external endpoint, another
model or checkpoint, a sampling temperature), then the configured agent on a few tasks through the
full stack, without training (`alight.trainer.tasks`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer.tasks import DevRun, run_tasks


def with_endpoint(cfg: ExperimentConfig, endpoint: str | None, model: str | None) -> ExperimentConfig:
    """The config with its engine swapped for an external OpenAI-compatible endpoint (via LiteLLM),
    serving `model` (default `engine.served_name`); without `endpoint`, the config as it is."""
    if endpoint is None:
        return cfg
    name = model or cfg.engine.served_name
    litellm_model = name if "/" in name else f"openai/{name}"
    engine = dataclasses.replace(cfg.engine, kind="litellm", model=litellm_model, base_url=endpoint, options={})
    return dataclasses.replace(cfg, engine=engine)


def served_model(cfg: ExperimentConfig, model: str) -> str:
    """What the configured engine loads for `--model`: a model directory, a training checkpoint, or
    a run directory (its newest checkpoint), as `alight serve` resolves it (a LiteLLM model string
    for a litellm engine or a remote vLLM server, as it is). Handed to the stack, not written into
    the config."""
    from alight.engines.factory import engine_class

    if not engine_class(cfg.engine.kind).loads_model(cfg.engine):
        return model
    from alight.models.resolve import resolve_model

    return str(resolve_model(model, checkpoints=True))


def with_temperature(cfg: ExperimentConfig, temperature: float | None) -> ExperimentConfig:
    """The config with the engine's default sampling temperature replaced (0: greedy)."""
    if temperature is None:
        return cfg
    if temperature < 0:
        raise ConfigError(f"--temperature must be 0 or more, not {temperature}")
    sampling = dataclasses.replace(cfg.engine.sampling, temperature=temperature)
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, sampling=sampling))


def run_dev(
    cfg: ExperimentConfig,
    run_dir: Path | None = None,
    *,
    n: int | None = None,
    endpoint: str | None = None,
    model: str | None = None,
    split: str | None = None,
    all_rows: bool = False,
    temperature: float | None = None,
    on_progress: Callable[[dict[str, int]], None] | None = None,
    prompt: str | None = None,
) -> DevRun:
    """Run the agent on `n` tasks (default `dev.n`) of `split` (see `dev_rows`), or on every task
    of the split with `all_rows`, through store, proxy, engine and runner pool; the store stays in
    `run_dir` (default `{output_dir}/{name}-dev-{timestamp}`) for `alight trace`. `endpoint` /
    `model` swap the engine for an OpenAI-compatible endpoint (see `with_endpoint`) or have it serve
    another model or checkpoint (see `served_model`); `temperature` replaces the sampling
    temperature (0: greedy, for evaluation).
    `on_progress` gets the counts of ended rollouts. `prompt` (an APO run directory, a
    best_prompt.json or a text file) is published as the `algorithm.apo.resource` PromptTemplate
    agents read. Every input problem raises ConfigError before a worker starts."""
    started = time.monotonic()
    if all_rows and n is not None:
        raise ConfigError("--all runs every task of the split: drop --n")
    cfg = with_temperature(with_endpoint(cfg, endpoint, model), temperature)
    serving = served_model(cfg, model) if model is not None and endpoint is None else None
    run = run_tasks(
        cfg, run_dir, n=n, model=serving, split=split, all_rows=all_rows, on_progress=on_progress, prompt=prompt
    )
    return dataclasses.replace(run, elapsed_s=time.monotonic() - started)  # resolving --model counts too
