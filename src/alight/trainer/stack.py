"""The local stack of a run: store server, engine behind the LLM proxy, and the runner pool.

`alight dev` and `alight train` start the same stack: a SQLite store in the run directory served
over HTTP (or an existing store server), the configured engine behind the proxy (which records
every LLM call into the store), the policy published as the `llm` resource, and `n_runners`
runners running the agent (worker processes, or Ray actors with `runner.backend: ray`). What
runners and agents are handed are the advertised URLs (`store.advertise_url`, `proxy.advertise_url`;
see `alight.serving.advertise`), so that ones on other machines (Ray actors, or `alight runner
--store URL`) reach the same store and proxy.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.agent_setup import judged_agent, runner_agent, runner_command
from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.serving.advertise import check_advertise_url
from alight.serving.auth import TOKEN_ENV, is_loopback, resolve_token
from alight.store.factory import check_store, open_store
from alight.trainer.run_dir import STORE_FILE

if TYPE_CHECKING:
    from alight.proxy.server import ProxyServer
    from alight.runner.base import Pool
    from alight.store.base import Store
    from alight.store.server import StoreServer

logger = logging.getLogger(__name__)


def check_endpoint(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail early, in one line, when an OpenAI-compatible endpoint does not answer at all."""
    import httpx

    url = base_url.rstrip("/") + "/models"
    try:
        httpx.get(url, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as err:
        raise ConfigError(f"endpoint {base_url} does not answer ({type(err).__name__}: {err})") from None


class LocalStack:
    """Store server, proxy + engine and runner pool for one run; `with LocalStack(...) as stack:`.

    `model` is what the engine serves (a run's checkpoint; default `engine.model`): runtime state
    is handed over here, never written into the config. The config is validated already
    (`alight.trainer.checks`): the stack checks only what it is given beside it."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        *,
        model: str | None = None,
        n_runners: int | None = None,
        weights_version: int | None = None,
        extra_resources: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = cfg.engine.model if model is None else model
        self.extra_resources = dict(extra_resources or {})  # published beside `llm` (e.g. a PromptTemplate)
        self.weights_version = weights_version  # recorded on spans until the first update (a resumed run's step)
        self.run_dir = run_dir
        self.n_runners = cfg.runner.n_runners if n_runners is None else n_runners  # 0: runners run elsewhere
        self.store_spec = check_store(cfg.store)  # a bad store.kind/url/path fails here, before anything starts
        self.store_url: str | None = cfg.store.url  # as this process reaches the store
        self.store_advertise_url: str | None = None  # as runners reach it, here and on other machines
        # One shared token for the run's store, proxy and runners (ALIGHT_TOKEN); None on loopback.
        self.token = resolve_token()
        self._store_server: StoreServer | None = None
        self.proxy_server: ProxyServer | None = None
        self.pool: Pool | None = None

    def start(self) -> LocalStack:
        from alight.backends.factory import backend_for
        from alight.engines.factory import engine_options, make_engine
        from alight.proxy.proxy import Proxy
        from alight.proxy.server import ProxyServer
        from alight.runner.factory import make_pool
        from alight.store.client import StoreClient

        store_advertise = self.cfg.store.advertise_url
        if store_advertise:  # a bad URL fails here, in one line naming the key, before anything starts
            store_advertise = check_advertise_url(store_advertise, "store.advertise_url")
        if self.cfg.proxy.advertise_url:
            check_advertise_url(self.cfg.proxy.advertise_url, "proxy.advertise_url")
        options = engine_options(self.cfg.engine, model=self.model)
        options.update(backend_for(self.cfg).engine_options(self.cfg))  # what the backend's weights need served
        engine = make_engine(self.cfg.engine.kind, **options)  # bad engine options fail here, before anything starts
        try:
            if self.store_url is None:
                from alight.store.server import StoreServer

                self.run_dir.mkdir(parents=True, exist_ok=True)
                store = open_store(self.store_spec, default_path=self.run_dir / STORE_FILE)
                self._store_server = StoreServer(
                    store,
                    host=self.cfg.store.host,
                    port=self.cfg.store.port,
                    token=self.token,
                    advertise_url=store_advertise,
                    agent_spans=self.cfg.runner.agent_spans,
                ).start()
                self.store_url = self._store_server.local_url
                store_advertise = self._store_server.url
            assert self.store_url is not None
            self.store_advertise_url = store_advertise or self.store_url
            assert self.store_advertise_url is not None
            logger.info("store at %s", self.store_advertise_url)
            proxy_store = StoreClient(self.store_url, token=self.token)
            proxy = Proxy(
                engine,
                proxy_store,
                version=self.weights_version,
                default_sampling=self.sampling_parameters(),
            )
            self.proxy_server = ProxyServer(
                proxy,
                host=self.cfg.proxy.host,
                port=self.cfg.proxy.port,
                token=self.token,
                advertise_url=self.cfg.proxy.advertise_url,
                resolve=proxy_store.check_credential if self.token is not None else None,  # agent keys
            ).start()
            url, kind = self.proxy_server.url, self.cfg.engine.kind
            logger.info("LLM proxy at %s (engine %s, model %s)", url, kind, self.model)
            asyncio.run(self._publish())
            self._tell_remote_runners()
            if self.n_runners > 0:
                self.pool = make_pool(
                    self.cfg.runner,
                    judged_agent(
                        runner_agent(self.cfg.agent, check=False, reward=self.cfg.reward), self.cfg.reward, self.run_dir
                    ),
                    self.store_advertise_url,
                    n_runners=self.n_runners,
                    token=self.token,
                ).start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def store_server(self) -> StoreServer | None:
        """The store server this stack started (None: it uses `store.url`'s)."""
        return self._store_server

    def _tell_remote_runners(self) -> None:
        """Log the command that runs agents for this run on another machine: a warning when no
        runner runs here (nothing happens until one starts), else only when other machines can
        reach the store."""
        from urllib.parse import urlsplit

        agent = runner_command(runner_agent(self.cfg.agent, check=False, reward=self.cfg.reward))
        command = f"alight runner --store {self.store_advertise_url} {agent}"
        if self.token is not None:
            command += f" (with ALIGHT_RUNNER_CREDENTIAL set to a runner credential, or {TOKEN_ENV} to the run's token)"
        if self.n_runners == 0:
            logger.warning("no runners on this machine (runner.n_runners=0): agents run once you start %s", command)
        elif not is_loopback(urlsplit(self.store_advertise_url or "").hostname or "localhost"):
            logger.info("runners on other machines: %s", command)

    def sampling_parameters(self) -> dict[str, Any]:
        """The configured sampling: published with the `llm` resource, and the proxy's defaults."""
        sampling = self.cfg.engine.sampling
        return {"temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_tokens}

    def resources(self) -> dict[str, Any]:
        """The resource set runners use: the policy behind the proxy as `llm`, and `extra_resources`."""
        from alight.types import LLMResource

        if self.proxy_server is None:
            raise RuntimeError("the stack is not started")
        return {
            **self.extra_resources,
            "llm": LLMResource(
                endpoint=self.proxy_server.url,
                model=self.cfg.engine.served_name,
                sampling_parameters=self.sampling_parameters(),
            ),
        }

    async def _publish(self) -> None:
        from alight.store.client import StoreClient

        async with StoreClient(self._url(), token=self.token) as store:
            await store.add_resources(self.resources())

    def trainer_store(self) -> Store:
        """A store for the trainer's own loop: a second connection to the run's SQLite file (its
        columnar reads), or a client of the store server (the run's memory store, or store.url's)."""
        if self._store_server is not None and self.store_spec.is_file:
            return open_store(self.store_spec, default_path=self.run_dir / STORE_FILE)
        return open_store(self._url(), token=self.token)

    def _url(self) -> str:
        if self.store_url is None:
            raise RuntimeError("the stack is not started")
        return self.store_url

    def stop(self) -> None:
        """Stop the pool (draining), then the proxy (flushing spans), then the store."""
        for part, name in ((self.pool, "runner pool"), (self.proxy_server, "proxy"), (self._store_server, "store")):
            if part is None:
                continue
            try:
                part.stop()
            except Exception:
                logger.exception("stopping the %s failed", name)
        self.pool = self.proxy_server = self._store_server = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
