"""Running the proxy: `ProxyServer` serves it from a daemon thread with its own event loop, the
way `alight.store.server.StoreServer` serves a store (both are `alight.serving.BackgroundServer`s)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from alight.proxy.proxy import Proxy
from alight.proxy.routes import create_app
from alight.serving.app import DEFAULT_MAX_BODY_BYTES
from alight.serving.auth import Resolve, check_bind
from alight.serving.background import BackgroundServer


class ProxyServer(BackgroundServer):
    """Serves a `Proxy` over HTTP from a daemon thread (uvloop). Port 0 picks a free port.

    The engine and store are used on that thread's loop only: started there, and closed there by
    `stop()`. From other threads use `run` (or await `proxy.update_weights` / `proxy.flush`, which
    hop onto that loop by themselves). `url` is the proxy root as agents on other machines reach
    it (`advertise_url`, or for a wildcard bind this machine's routable address): what the trainer
    publishes as `LLMResource.endpoint`. `stop()` finishes the calls in flight and stores their
    spans. Beyond loopback it needs `token` (or `insecure`; see `alight.serving.auth.check_bind`);
    `resolve` checks the other credentials agents present (`StoreClient.check_credential`: agent keys)."""

    what = "proxy"
    graceful_shutdown_s = 10.0

    def __init__(
        self,
        proxy: Proxy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        admin: bool = False,
        token: str | None = None,
        insecure: bool = False,
        advertise_url: str | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        check_bind(host, token, insecure=insecure, what=self.what)
        app = create_app(proxy, max_body_bytes=max_body_bytes, admin=admin, token=token, resolve=resolve)
        super().__init__(app, host=host, port=port, advertise_url=advertise_url)
        self.proxy = proxy

    def base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        """The OpenAI base URL: per attempt when ids are given, else the plain `/v1`."""
        if rollout_id is None or attempt_id is None:
            return f"{self.url}/v1"
        return f"{self.url}/rollout/{rollout_id}/attempt/{attempt_id}/v1"

    def start(self, timeout_s: float = 120.0) -> ProxyServer:
        """Start serving (the engine loads first); return once `/health` answers."""
        return super().start(timeout_s)

    async def before_serving(self) -> None:
        # Before serving, so that a failure here is the caller's one-line error; the app's
        # lifespan closes the proxy once it has served.
        try:
            await self.proxy.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.proxy.close()
            raise

    def update_weights(self, weights: Mapping[str, Any] | str, version: int, timeout_s: float | None = None) -> None:
        """Blocking form of `Proxy.update_weights`, for trainers without an event loop."""
        self.run(self.proxy.update_weights(weights, version), timeout_s)

    def flush(self, timeout_s: float | None = 60.0) -> None:
        """Blocking form of `Proxy.flush`: every answered call's span is in the store on return."""
        self.run(self.proxy.flush(), timeout_s)
