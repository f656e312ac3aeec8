"""The HTTP store server: any `Store` behind JSON routes, for runners in other processes or hosts.

One route per `Store` method (`alight.store.server_routes`; `create_app` serves them), on the
app every alight server starts from (`alight.serving.app.ServerApp`). Errors travel as
`{"error": {"code": ..., "message": ...}}` with the status of the `AlightError` class, so the
client (`alight.store.client.StoreClient`) raises what the store raised. Hot routes skip FastAPI's
body and response models: they read bytes, validate them with cached pydantic adapters, and answer
bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import fastapi
from pydantic import BaseModel

from alight.errors import ConfigError, StoreError
from alight.serving.app import DEFAULT_MAX_BODY_BYTES, Handler, ServerApp
from alight.serving.auth import check_bind
from alight.serving.background import BackgroundServer
from alight.serving.credentials import Kind
from alight.serving.openapi import Operation
from alight.store import wire
from alight.store.base import Store
from alight.store.remembered import RememberedAnswers
from alight.store.scopes import ADMIN_ONLY, StoreAccess
from alight.store.server_routes import ROUTES, StoreApp

logger = logging.getLogger(__name__)


def _error_body(status: int, code: str | None, message: str) -> bytes:
    # Every answer names a code the client maps back to an error class; unnamed ones by status.
    return wire.error_body(code or (StoreError.code if status >= 500 else "http_error"), message)


def check_max_wait(max_wait_s: float) -> float:
    """`max_wait_s` if it is a usable hold for `/store/wait` (finite, > 0), else a one-line ConfigError."""
    if not math.isfinite(max_wait_s) or max_wait_s <= 0:
        raise ConfigError(f"the store's max wait must be a finite number of seconds > 0, got {max_wait_s}")
    return max_wait_s


# -- the app ----------------------------------------------------------------------------------


def create_app(
    store: Store,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    watchdog_interval_s: float | None = 1.0,
    token: str | None = None,
    max_wait_s: float = wire.MAX_WAIT_S,
    agent_spans: bool = False,
) -> fastapi.FastAPI:
    """The store's HTTP app. A lifespan task runs `store.reap_timed_out()` every
    `watchdog_interval_s` seconds (None: never). `/store/wait` holds a request at most
    `max_wait_s` seconds, and not past its client's disconnect. The app does not close the store.
    With `token`, every route but /health needs it or a credential minted from it (runner
    credentials, agent keys: `alight.store.scopes`, which also says what `agent_spans` lets agents do)."""
    access = StoreAccess(store, token, agent_spans=agent_spans)
    server = ServerApp(
        "store server", error_body=_error_body, max_body_bytes=max_body_bytes, token=token,
        lifespan=functools.partial(_watching, store, watchdog_interval_s, access),
        resolve=access.resolve if token is not None else None,
    )  # fmt: skip
    remembered = RememberedAnswers(server)
    check_max_wait(max_wait_s)
    app = StoreApp(store, access, server, max_wait_s=max_wait_s, max_body_bytes=max_body_bytes)
    operations: list[Operation] = []

    def add(
        path: str,
        method: str,
        handler: Handler,
        summary: str,
        body_model: type[BaseModel] | None = None,
        query: dict[str, dict[str, Any]] | None = None,
        idempotent: bool = False,
        who: frozenset[Kind] = ADMIN_ONLY,
    ) -> None:
        endpoint = server.guard(access.allowing(who, handler))
        server.app.add_route(path, remembered.wrap(endpoint) if idempotent else endpoint, methods=[method])
        operations.append(Operation(path, method, summary, body_model, query or {}))

    for r in ROUTES:
        add(r.path, r.method, functools.partial(r.handler, app), r.summary, r.body_model, r.query, r.idempotent, r.who)
    for path, handler, summary, model in access.routes(server.body):  # runner credentials; keys checked for the proxy
        add(path, "POST", handler, summary, model)
    server.serve_openapi(operations)
    return server.app


@contextlib.asynccontextmanager
async def _watching(store: Store, interval_s: float | None, access: StoreAccess) -> AsyncIterator[None]:
    # The app's lifespan: the watchdog runs while the app serves.
    task = None
    if interval_s is not None:
        task = asyncio.create_task(_watchdog(store, interval_s, access), name="alight-store-watchdog")
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _watchdog(store: Store, interval_s: float, access: StoreAccess) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            reaped = await store.reap_timed_out()
            access.ended(*(attempt.attempt_id for attempt in reaped))
        except Exception:
            logger.exception("store watchdog: reap_timed_out failed; trying again in %.1f s", interval_s)
        else:
            if reaped:
                logger.info("store watchdog: timed out %d attempt(s)", len(reaped))


# -- running it -------------------------------------------------------------------------------


class StoreServer(BackgroundServer):
    """Serves a store over HTTP from a daemon thread with its own event loop (uvloop).

    The store object is used only on that thread's loop, and closed there by `stop()`.
    Port 0 (the default) picks a free port; `url` gives the real one once started, as runners on
    other machines reach it (`advertise_url`, or for a wildcard bind this machine's routable
    address), `local_url` as this machine does. Beyond loopback it needs `token` (or `insecure`;
    see `alight.serving.auth.check_bind`).
    """

    what = "store server"
    error = StoreError

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        watchdog_interval_s: float | None = 1.0,
        token: str | None = None,
        insecure: bool = False,
        max_wait_s: float = wire.MAX_WAIT_S,
        advertise_url: str | None = None,
        agent_spans: bool = False,
    ) -> None:
        check_bind(host, token, insecure=insecure, what=self.what)
        app = create_app(
            store,
            max_body_bytes=max_body_bytes,
            watchdog_interval_s=watchdog_interval_s,
            token=token,
            max_wait_s=max_wait_s,
            agent_spans=agent_spans,
        )
        super().__init__(app, host=host, port=port, advertise_url=advertise_url)
        self.store = store

    async def after_serving(self) -> None:
        await self.store.close()


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 4747,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    watchdog_interval_s: float | None = 1.0,
    on_ready: Callable[[str], None] | None = None,
    max_wait_s: float = wire.MAX_WAIT_S,
    token: str | None = None,
    insecure: bool = False,
    agent_spans: bool = False,
) -> None:
    """Serve `store` until Ctrl-C or SIGTERM, then shut down gracefully and close the store.
    `on_ready` is called with the server's URL once it answers (ConfigError before that if the
    port is taken, or for a bind beyond loopback without `token` or `insecure`)."""
    try:
        server = StoreServer(
            store,
            host=host,
            port=port,
            max_body_bytes=max_body_bytes,
            watchdog_interval_s=watchdog_interval_s,
            max_wait_s=max_wait_s,
            token=token,
            insecure=insecure,
            agent_spans=agent_spans,
        )
        server.serve_until_interrupted(on_ready)
    except ConfigError:  # never served (no token, the port is taken): the store is still ours to close
        asyncio.run(store.close())
        raise
