"""`alight` Typer app: each command parses its arguments, loads the config and makes one call into
the library (`alight.trainer`); the `*_render` modules show the result.
Commands import what they need inside their body so `alight --help` stays fast."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from alight import __version__
from alight.cli import recipes, servers
from alight.errors import AlightError, ConfigError, TrainingError

#: The config argument of every command that runs an experiment.
CONFIG_HELP = "Experiment YAML, or a shipped experiment's name (`alight recipes` lists them)."


def _plain_flags(params: list[Any]) -> list[Any]:
    """Boolean flags show in help as flags (`--json`), not with a type (`--json <bool>`)."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class _Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


app = typer.Typer(
    name="alight",
    cls=_Group,
    help="Train the LLM inside any AI agent with reinforcement learning, without rewriting the agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"alight {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    # Commands show progress themselves; logs are for problems (and everything with --verbose).
    level = logging.DEBUG if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # a run's own log file may take more (train.log)
        handler.setLevel(level)


app.command(cls=_Command)(recipes.recipes)
app.command(cls=_Command)(recipes.init)
app.command(cls=_Command)(servers.store)
app.command(cls=_Command)(servers.serve)


@app.command(cls=_Command, context_settings={"allow_extra_args": False})
def dev(
    config: Annotated[Path, typer.Argument(help=CONFIG_HELP)],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Hydra overrides such as runner.n_runners=2.", show_default=False)
    ] = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="Tasks to run (default: the config's dev.n).")] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Any OpenAI-compatible base URL to use instead of the config's engine.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="With --endpoint: the model name there (a LiteLLM model string works too). Without: a model"
            " directory, checkpoint or training run directory (its newest checkpoint) for the config's engine."
        ),
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="Data split the tasks come from: train or val (default: the config's dev.split).")
    ] = None,
    all_rows: Annotated[
        bool, typer.Option("--all", help="Run every task of the split (as training validates), not --n of them.")
    ] = False,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature instead of the config's (0: greedy, to evaluate).")
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Where the run's store is kept (default: OUTPUT_DIR/NAME-dev-TIME).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    prompt: Annotated[
        str | None,
        typer.Option(help="The prompt resource agents read: an APO run directory (its best prompt) or a text file."),
    ] = None,
) -> None:
    """Dry-run the agent on a few tasks (no training), or evaluate a model: --split val --all --model RUN_DIR.

    Each rollout is shown (status, reward, LLM and tool calls, time, error), then the mean reward."""
    from rich.console import Console

    from alight.cli import dev_render as show
    from alight.commands.dev import run_dev
    from alight.config import load_config, to_object

    cfg = to_object(load_config(config, overrides or []))
    console = Console(stderr=as_json)
    with console.status("starting store, engine, proxy and runners...") as status:

        def progress(counts: dict[str, int]) -> None:
            status.update(f"rollouts ended: {counts['ended']}/{counts['total']}")

        run = run_dev(
            cfg,
            run_dir,
            n=n,
            endpoint=endpoint,
            model=model,
            split=split,
            all_rows=all_rows,
            temperature=temperature,
            on_progress=progress,
            prompt=prompt,
        )
    show.dev_run(console, run, as_json=as_json)


@app.command("eval", cls=_Command, context_settings={"allow_extra_args": False})
def eval_(
    config: Annotated[Path, typer.Argument(help=CONFIG_HELP)],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Hydra overrides such as runner.n_runners=2.", show_default=False)
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model directory, checkpoint, training run directory (its newest checkpoint), LiteLLM model,"
            " or an endpoint: URL or NAME@URL. Repeat to compare; the first is the baseline (default: the config's)."
        ),
    ] = None,
    split: Annotated[str | None, typer.Option(help="Evaluate every task of this split: train or val.")] = None,
    tasks: Annotated[Path | None, typer.Option(help="Evaluate every row of this task file instead.")] = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per task and model.")] = 1,
    k: Annotated[str | None, typer.Option("--k", help="pass@k for these k, such as 1,4 (default: 1 and n).")] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature instead of the config's (0: greedy; --n > 1 needs > 0).")
    ] = None,
    success: Annotated[float, typer.Option(help="A sample succeeds at reward >= this (for pass@k).")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap resamples.")] = 0,
    resamples: Annotated[int, typer.Option(min=1, help="Bootstrap resamples.")] = 2000,
    per_task: Annotated[bool, typer.Option("--per-task", help="Also show each task's rewards.")] = False,
    run_dir: Annotated[
        Path | None, typer.Option(help="Where the stores are kept (default: OUTPUT_DIR/NAME-eval-TIME).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Evaluate models side by side on a split or task file: mean reward ± 95% CI, pass@k, paired difference.

    Each model runs every task --n times through the full stack; a failed rollout scores 0."""
    from alight.cli import eval_render as show
    from alight.commands.evaluation import run_eval
    from alight.config import load_config, to_object

    cfg = to_object(load_config(config, overrides or []))
    with show.progress(quiet=as_json) as on_progress:
        report = run_eval(
            cfg, model or [], split=split, tasks_file=tasks, n=n, k=k, temperature=temperature, success=success,
            seed=seed, resamples=resamples, run_dir=run_dir, on_progress=on_progress,
        )  # fmt: skip
    show.eval_report(report, as_json=as_json, per_task=per_task)


@app.command(cls=_Command, context_settings={"allow_extra_args": False})
def train(
    config: Annotated[Path, typer.Argument(help=CONFIG_HELP)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Hydra overrides such as algorithm.lr=1e-6 runner.n_runners=8.", show_default=False),
    ] = None,
    show_cfg: Annotated[bool, typer.Option("--cfg", help="Print the resolved config and exit.")] = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue the newest run of this experiment (or --run-dir) from its checkpoint."),
    ] = False,
    run_dir: Annotated[
        Path | None, typer.Option(help="The run directory (default: OUTPUT_DIR/NAME-TIME; with --resume, the newest).")
    ] = None,
    no_dashboard: Annotated[
        bool,
        typer.Option(
            "--no-dashboard",
            "--json",
            help="No live view: print one JSON line per step (the default when not a terminal).",
        ),
    ] = False,
) -> None:
    """Train the model behind the configured agent: warm start, then GRPO/PPO through the real stack."""
    from alight.config import load_config, to_object, to_yaml

    loaded = load_config(config, overrides or [])
    if show_cfg:
        sys.stdout.write(to_yaml(loaded))
        return
    from alight.cli.train_render import train_watchers
    from alight.trainer import Trainer

    cfg = to_object(loaded)
    with train_watchers(cfg, dashboard=not no_dashboard) as watchers:
        result = Trainer(cfg, run_dir=run_dir, resume=resume, watchers=watchers).fit()
    if result.stopped:
        if result.checkpoint is not None:
            typer.echo(
                f"alight train: stopped after step {result.steps}; checkpoint {result.checkpoint}; continue with: "
                f"alight train {config} --resume --run-dir {result.run_dir}",
                err=True,
            )
        else:
            typer.echo("alight train: stopped before the first checkpoint; nothing to resume", err=True)
        raise typer.Exit(143 if result.signal == "SIGTERM" else 130)


@app.command(cls=_Command, context_settings={"allow_extra_args": False})
def trace(
    target: Annotated[str, typer.Argument(help="A run directory, a store .db file, or a store server URL.")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="With --transitions: Hydra overrides of the settings, such as adapter.agent_match='write|rewrite'"
            " algorithm.advantage=rloo.",
            show_default=False,
        ),
    ] = None,
    rollout: Annotated[str | None, typer.Option("--rollout", help="Show this rollout's spans as a tree.")] = None,
    all_attempts: Annotated[bool, typer.Option("--all-attempts", help="Include the spans of earlier attempts.")] = (
        False
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables and trees.")] = False,
    otlp: Annotated[Path | None, typer.Option(help="Also write the spans to this file as OTLP/JSON.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most rollouts to list.")] = 50,
    transitions: Annotated[
        bool,
        typer.Option(
            "--transitions", help="Show the transitions the rollout yields: agent, step, lengths, reward, advantage."
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(help="With --transitions: the experiment YAML whose adapter and algorithm settings to use."),
    ] = None,
    export_sft: Annotated[
        Path | None,
        typer.Option(
            "--export-sft",
            help="Write the rollouts' selected LLM calls as chat rows {messages, tools}: OUT.jsonl, or any other"
            " path a Hugging Face dataset directory. Settings: --config, else the run's config.yaml.",
        ),
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="With --export-sft: the reward bar (default: algorithm.sft_min_reward).")
    ] = None,
    select: Annotated[
        str | None, typer.Option(help="With --export-sft: threshold or best_of_group (default: algorithm.sft.select).")
    ] = None,
    agent_match: Annotated[
        str | None, typer.Option(help="With --export-sft: regex of the agents kept (default: adapter.agent_match).")
    ] = None,
    split: Annotated[
        list[str] | None,
        typer.Option(help="With --export-sft: rollouts of this split: train, val, dev; repeatable (default: train)."),
    ] = None,
) -> None:
    """Show a run's rollouts, one rollout's spans or the transitions it yields; export spans as OTLP/JSON.

    A rollout's tree shows its attempts and their spans: agents, LLM calls, tool calls, rewards.
    With --transitions, the adapter and algorithm settings are the experiment's: --config (the
    defaults without it) and Hydra overrides, as for alight train. --export-sft writes the
    transitions fine-tuning would select (algorithm.sft) as chat rows, to train on anywhere."""
    if export_sft is not None:
        settings = dict(min_reward=min_reward, select=select, agent_match=agent_match, splits=split or [])
        _export_sft(target, export_sft, config, overrides or [], settings, as_json)
    elif transitions:
        if rollout is None:
            raise ConfigError("--transitions needs --rollout ID (the rollout whose transitions to show)")
        _show_transitions(target, rollout, config, overrides or [], as_json)
    else:
        if config is not None or overrides:
            given = " ".join(overrides or []) or f"--config {config}"
            raise ConfigError(f"settings ({given}) apply to --transitions only")
        _show_spans(target, rollout, all_attempts=all_attempts, otlp=otlp, limit=limit, as_json=as_json)


def _export_sft(
    target: str, out: Path, config: Path | None, overrides: list[str], settings: dict[str, Any], as_json: bool
) -> None:
    from alight.cli.trace_render import sft_export
    from alight.commands import export

    chosen = export.export_settings(target, config=config, overrides=overrides, **settings)
    sft_export(export.export_sft(target, out, *chosen), as_json=as_json)


def _show_transitions(target: str, rollout: str, config: Path | None, overrides: list[str], as_json: bool) -> None:
    from rich.console import Console

    from alight.cli import trace_render as show
    from alight.commands import trace as reading

    data = reading.read_transitions(target, rollout, config=config, overrides=overrides)
    show.transitions(Console(), data, as_json=as_json)


def _show_spans(
    target: str, rollout: str | None, *, all_attempts: bool, otlp: Path | None, limit: int, as_json: bool
) -> None:
    from rich.console import Console

    from alight.cli import trace_render as show
    from alight.commands import trace as reading

    console = Console()
    if rollout is None:
        show.rollouts(console, reading.read_rollouts(target, limit=limit, otlp_path=otlp), target, as_json=as_json)
    else:
        detail = reading.read_rollout(target, rollout, all_attempts=all_attempts, otlp_path=otlp)
        show.rollout(console, detail, as_json=as_json)
    if otlp is not None and not as_json:
        console.print(f"[dim]wrote OTLP/JSON spans to {otlp}[/dim]")


app.command(cls=_Command)(servers.runner)


def main() -> None:
    """Console entry point: user errors print one line and exit with code 2."""
    try:
        app()
    except TrainingError as err:  # the run failed, not the user's input
        typer.echo(f"error: {err}", err=True)
        sys.exit(1)
    except AlightError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
