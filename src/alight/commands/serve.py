"""Serving until interrupted, as the commands do: `alight serve` (a model or a training checkpoint
on the OpenAI-compatible API, no trainer needed), `alight store` (a standalone store server) and
`alight runner` (a runner pool working for a store server anywhere)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.models.resolve import TINY
from alight.serving.auth import check_bind

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.runner.slots import PoolStats

logger = logging.getLogger(__name__)


def serve_store(
    db: Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 4747,
    max_body_bytes: int | None = None,
    watchdog_interval_s: float | None = 1.0,
    on_ready: Callable[[str], None] | None = None,
    max_wait_s: float | None = None,  # how long /store/wait holds a request (default 300 s)
    write_id_retention_s: float | None = None,  # the write ids the store keeps (default: WriteIdLimits)
    max_write_ids: int | None = None,
    token: str | None = None,
    insecure: bool = False,
    agent_spans: bool = False,
) -> None:
    """Serve a store until Ctrl-C or SIGTERM: the SQLite file `db` (durable), or without it a
    store in memory. ConfigError for a taken port or an unusable `db`, or for a bind beyond
    loopback with neither `token` nor `insecure`, before serving. `agent_spans`: agent keys may
    write their own attempt's spans (alight.store.scopes)."""
    from alight.serving.app import DEFAULT_MAX_BODY_BYTES
    from alight.store.factory import StoreSpec, open_store
    from alight.store.server import check_max_wait, serve
    from alight.store.wire import MAX_WAIT_S
    from alight.store.write_ids import WriteIdLimits

    if not insecure:  # refuse before a SQLite file is made (the server warns about --insecure)
        check_bind(host, token, what="store server")
    max_wait_s = check_max_wait(MAX_WAIT_S if max_wait_s is None else max_wait_s)
    defaults = WriteIdLimits()
    limits = WriteIdLimits(
        retention_s=defaults.retention_s if write_id_retention_s is None else write_id_retention_s,
        max_ids=defaults.max_ids if max_write_ids is None else max_write_ids,
    )
    spec = StoreSpec("sqlite", path=db) if db is not None else StoreSpec("memory")
    store = open_store(spec, write_id_limits=limits)
    serve(
        store,
        host=host,
        port=port,
        max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        watchdog_interval_s=watchdog_interval_s,
        on_ready=on_ready,
        max_wait_s=max_wait_s,
        token=token,
        insecure=insecure,
        agent_spans=agent_spans,
    )


def serve_runners(
    agent: str | LitAgent,
    store_url: str,
    *,
    n_runners: int = 4,
    tracer: str = "light",
    drain_timeout_s: float = 30.0,
    on_ready: Callable[[Any], None] | None = None,
    token: str | None = None,
    backend: str = "local",
    ray_address: str | None = None,
) -> PoolStats:
    """Run `n_runners` runners (`backend`: local worker processes, or Ray actors on the cluster at
    `ray_address`, None: a local one) on the rollouts of the store server at `store_url` until
    Ctrl-C or SIGTERM, then drain (see `alight.runner.service`); returns the pool's counts. A bad
    agent, backend or URL raises ConfigError before any runner starts. `token`: the store's and
    the proxy's (default: `ALIGHT_TOKEN`)."""
    from alight.config.schema import RayConfig
    from alight.runner.service import run_pool_until_interrupted

    return run_pool_until_interrupted(
        agent,
        store_url,
        n_runners=n_runners,
        tracer=tracer,
        backend=backend,
        ray=RayConfig(address=ray_address),
        drain_timeout_s=drain_timeout_s,
        on_ready=on_ready,
        token=token,
    )


def serve_model(
    model: str = TINY,
    *,
    engine: str = "embedded",
    host: str = "127.0.0.1",
    port: int = 8000,
    store_url: str | None = None,
    served_name: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    device: str = "cpu",
    admin: bool = False,
    on_ready: Callable[[str], None] | None = None,
    token: str | None = None,
    insecure: bool = False,
    system_prompt: str | None = None,
) -> None:
    """Serve `model` with `engine` until Ctrl-C; with `store_url`, record spans of calls that
    carry rollout/attempt ids into that store server. `base_url` is the upstream of the litellm
    engine (or a running vLLM server); `api_key_env` names the variable holding the upstream's key.
    `system_prompt` (an APO run directory, a best_prompt.json or a text file) becomes the system
    message of chat requests that bring none.
    Raises ConfigError for bad arguments (a missing model, an unknown engine, a taken port, a bind
    beyond loopback with neither `token` nor `insecure`). With `token`, clients send it as their
    `api_key`, and it is sent to the store server too."""
    if not insecure:  # refuse before loading the model (the server warns about --insecure)
        check_bind(host, token, what="proxy")
    from alight.config.schema import EngineConfig
    from alight.engines.factory import engine_class, engine_options, make_engine

    kind = engine_class(engine)  # an unknown engine: one line naming the kinds
    # dtype auto: the engine's own choice for `device`; what serve does not set keeps the engine's defaults
    spec = EngineConfig(
        kind=engine, model=model, base_url=base_url, api_key_env=api_key_env, device=device, dtype="auto"
    )
    loaded = model
    if kind.loads_model(spec):  # a model, a run directory or a checkpoint directory, resolved here
        from alight.models.resolve import resolve_model

        loaded = str(resolve_model(model, checkpoints=True))
    options: dict[str, Any] = {**engine_options(spec, model=loaded), "served_name": served_name}
    if kind.capabilities.adapters and kind.loads_model(spec):
        from alight.models.lora_layout import saved_adapters

        # A per-agent LoRA checkpoint: the base as `served_name`, each adapter as `served_name/agent`
        options["adapters"] = saved_adapters(loaded)
    prompt = None
    if system_prompt is not None:
        from alight.algorithms.apo.record import load_prompt

        prompt = load_prompt(system_prompt)
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer

    store = None
    if store_url is not None:
        from alight.store.factory import open_store

        store = open_store(store_url, token=token)
    served = make_engine(engine, **options)
    if prompt:
        from alight.engines.system_prompt import SystemPromptEngine

        served = SystemPromptEngine(served, prompt)
    proxy = Proxy(served, store)
    # Agent keys are the store's: the proxy asks it what a key opens (with the admin token).
    resolve = getattr(store, "check_credential", None) if token is not None else None
    server = ProxyServer(proxy, host=host, port=port, admin=admin, token=token, insecure=insecure, resolve=resolve)
    server.serve_until_interrupted(on_ready)
