"""The server commands of the `alight` app: `store`, `serve` and `runner` (each runs until Ctrl-C).
Registered on the app in `alight.cli.app`; each makes one call into the library."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from alight.errors import ConfigError
from alight.models.resolve import TINY

# The run's shared token (see README "Security"); read from ALIGHT_TOKEN, never shown in help or logs.
_Token = Annotated[
    str | None,
    typer.Option(
        envvar="ALIGHT_TOKEN",
        show_default=False,
        help="Bearer token clients must send (default: the ALIGHT_TOKEN variable, which keeps it out of ps).",
    ),
]
# A runner's: a runner credential minted by the store (least privilege), else the run's token.
_RunnerToken = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=["ALIGHT_RUNNER_CREDENTIAL", "ALIGHT_TOKEN"],
        show_default=False,
        help="A runner credential (alr.…, from POST /store/runners) or the store's token, with which the runners"
        " register for one (default: ALIGHT_RUNNER_CREDENTIAL, else ALIGHT_TOKEN).",
    ),
]
_Insecure = Annotated[
    bool,
    typer.Option("--insecure", help="Serve beyond 127.0.0.1 with no token: anyone who reaches the port can use it."),
]


def store(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port to listen on.")] = 4747,
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes the store to other machines.")] = (
        "127.0.0.1"
    ),
    db: Annotated[
        Path | None,
        typer.Option(help="SQLite file to keep the store in (durable). Without it the store lives in memory."),
    ] = None,
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body accepted, in MiB.")] = 32.0,
    watchdog_interval: Annotated[
        float, typer.Option(min=0.05, help="Seconds between checks for attempts that missed their heartbeat.")
    ] = 1.0,
    max_wait: Annotated[
        float, typer.Option(help="Seconds POST /store/wait holds a request at most (a longer timeout is cut to it).")
    ] = 300.0,
    write_id_retention: Annotated[
        float, typer.Option(help="Seconds a retried write's id is remembered (its retry is answered, not applied).")
    ] = 86400.0,
    max_write_ids: Annotated[
        int, typer.Option(help="Write ids remembered at most; beyond it the oldest are forgotten first.")
    ] = 100_000,
    token: _Token = None,
    insecure: _Insecure = False,
    agent_spans: Annotated[
        bool, typer.Option(help="With a token: agents may post their own attempt's spans (rewards) with their key.")
    ] = False,
) -> None:
    """Run a standalone store server, for runners on other machines."""
    from alight.commands.serve import serve_store

    where = f"SQLite file {db}" if db is not None else "memory (lost when the server stops; use --db to keep it)"

    def ready(url: str) -> None:
        typer.echo(f"alight store serving on {url}, keeping rollouts in {where}; Ctrl-C stops it", err=True)

    serve_store(
        db,
        host=host,
        port=port,
        max_body_bytes=int(max_body_mb * 2**20),
        watchdog_interval_s=watchdog_interval,
        on_ready=ready,
        max_wait_s=max_wait,
        write_id_retention_s=write_id_retention,
        max_write_ids=max_write_ids,
        token=token or None,
        insecure=insecure,
        agent_spans=agent_spans,
    )


def serve(
    model: Annotated[
        str,
        typer.Option(
            help="'tiny' (built offline), a packaged model (smollm2-135m-instruct), a model directory, a GGUF file,"
            " a hub id, a directory of training checkpoints (the newest is served), or for --engine litellm a"
            " LiteLLM model name such as openai/NAME."
        ),
    ] = TINY,
    engine: Annotated[str, typer.Option(help="Inference engine: embedded, vllm or litellm.")] = "embedded",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 exposes the API to other machines.")] = (
        "127.0.0.1"
    ),
    store: Annotated[
        str | None, typer.Option(help="Store server URL: record calls made for rollout attempts as LLM spans.")
    ] = None,
    served_name: Annotated[str | None, typer.Option(help="Model name clients ask for (default: from --model).")] = None,
    base_url: Annotated[
        str | None, typer.Option(help="Upstream OpenAI-compatible URL (litellm), or a running vLLM server.")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the upstream's API key (litellm).")
    ] = None,
    device: Annotated[str, typer.Option(help="Torch device of the embedded engine: cpu, cuda, cuda:1...")] = "cpu",
    admin: Annotated[
        bool, typer.Option(help="Add POST /admin/weights {checkpoint, version}, for trainers in other processes.")
    ] = False,
    token: _Token = None,
    insecure: _Insecure = False,
    system_prompt: Annotated[
        str | None,
        typer.Option(help="System message for chat requests that have none: an APO run directory or a text file."),
    ] = None,
) -> None:
    """Serve a model or a training checkpoint on an OpenAI-compatible API (/v1/chat/completions...)."""
    from alight.commands.serve import serve_model

    def ready(url: str) -> None:
        typer.echo(f"alight serve: {engine} engine on {url}/v1 (model {model}); Ctrl-C stops it", err=True)

    serve_model(
        model,
        engine=engine,
        host=host,
        port=port,
        store_url=store,
        served_name=served_name,
        base_url=base_url,
        api_key_env=api_key_env,
        device=device,
        admin=admin,
        on_ready=ready,
        token=token or None,
        insecure=insecure,
        system_prompt=system_prompt,
    )


def runner(
    store: Annotated[str, typer.Option(help="The store server's URL, e.g. http://127.0.0.1:4747.")],
    agent: Annotated[
        str | None, typer.Option(help="Agent entrypoint: 'module:name' or 'path/to/file.py:name'.")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="Or a program to run per attempt (any language), e.g. 'node agent.js'.")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="The agent's name on its spans (default: its function, class or program).")
    ] = None,
    n_runners: Annotated[int, typer.Option("--n-runners", "-n", min=1, help="Runners (processes or Ray actors).")] = 4,
    tracer: Annotated[str, typer.Option(help="light or otel.")] = "light",
    drain_timeout: Annotated[
        float, typer.Option(min=0.0, help="Seconds runners get to finish their attempts on Ctrl-C.")
    ] = 30.0,
    token: _RunnerToken = None,
    backend: Annotated[str, typer.Option(help="local (worker processes) or ray (Ray actors).")] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(help="With --backend ray: the cluster to join ('auto', ray://HOST:10001); none: a local one."),
    ] = None,
) -> None:
    """Run agents on the rollouts of a store server (on this or another machine) until Ctrl-C."""
    from alight.agent_setup import runner_agent
    from alight.commands.serve import serve_runners
    from alight.config.schema import AgentConfig

    if (agent is None) == (command is None):
        raise ConfigError("alight runner: give --agent (a Python entrypoint) or --command (a program), one of them")

    def ready(pool: object) -> None:
        runners = getattr(pool, "runners_name", "runners")  # "workers", "Ray actors": what the pool kind says
        typer.echo(f"alight runner: {n_runners} {runners} on {store}; Ctrl-C drains and stops", err=True)
        dashboard = getattr(pool, "dashboard_url", None)
        if dashboard:
            typer.echo(f"alight runner: Ray dashboard at {dashboard}", err=True)

    stats = serve_runners(
        runner_agent(AgentConfig(entrypoint=agent, command=command, name=name), check=False),
        store,
        n_runners=n_runners,
        tracer=tracer,
        drain_timeout_s=drain_timeout,
        on_ready=ready,
        token=token or None,
        backend=backend,
        ray_address=ray_address,
    )
    typer.echo(
        f"alight runner: stopped; attempts succeeded {stats.attempts_succeeded}, failed {stats.attempts_failed}, "
        f"timed out {stats.attempts_timed_out}; workers restarted {stats.workers_restarted}",
        err=True,
    )
