"""Authentication of alight's servers: one shared bearer token per run, and where it may be left out.

The store server, the LLM proxy and `alight serve` bind 127.0.0.1 by default. Binding any other
address needs a token (`--token` or the `ALIGHT_TOKEN` variable), or `--insecure` (a warning).
With a token, every route but `GET /health` asks for `Authorization: Bearer <token>` (what the
OpenAI client sends for its `api_key`) or `x-api-key: <token>` (what Anthropic clients send),
compared in constant time; anything else is answered 401 before the route runs. Runners name
themselves in `X-Alight-Runner`; the store refuses (403) their writes into attempts claimed by
another runner.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

#: The environment variable servers and clients read the token from when none is given.
TOKEN_ENV = "ALIGHT_TOKEN"
#: The header a runner names itself in; the store checks it against the attempt's claimant.
RUNNER_HEADER = "x-alight-runner"
#: Paths a server answers without a token: liveness only, nothing read or written.
OPEN_PATHS = frozenset({"/health"})
#: Set in the ASGI scope of a request whose token was checked.
AUTHENTICATED = "alight.authenticated"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def resolve_token(token: str | None = None) -> str | None:
    """`token`, else the `ALIGHT_TOKEN` variable; None for neither (an empty value counts as none)."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    return value or None


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches: localhost, 127.0.0.0/8, ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, *, insecure: bool = False, what: str = "server") -> None:
    """Refuse (ConfigError) to bind `host` beyond loopback without a token, unless `insecure`,
    which logs a warning instead."""
    if token is not None or is_loopback(host):
        return
    if not insecure:
        raise ConfigError(
            f"the {what} would listen on {host} without a token: set --token or {TOKEN_ENV}"
            " (or pass --insecure to serve anyone who reaches the port)"
        )
    logger.warning("the %s listens on %s with no token (--insecure): anyone who reaches it can use it", what, host)


def bearer_matches(authorization: str | None, token: str) -> bool:
    """True when an Authorization header is `Bearer <token>` (compared in constant time)."""
    if authorization is None:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def bearer_header(token: str | None) -> dict[str, str]:
    """The header a client sends for `token` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class BearerAuth:
    """ASGI middleware: HTTP requests outside `OPEN_PATHS` need the bearer token (or the same token
    as `x-api-key`), else `refuse(path, message)` answers (status 401) and the app never sees the
    request."""

    def __init__(self, app: ASGIApp, token: str, refuse: Callable[[str, str], bytes]) -> None:
        self.app = app
        self.token = token
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = api_key = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-api-key":
                api_key = value.decode("latin-1")
        if authorization is None and api_key is None:
            await self._answer(send, scope["path"], "missing Authorization: Bearer token (or x-api-key)")
            return
        given_key = api_key is not None and hmac.compare_digest(api_key.strip().encode(), self.token.encode())
        if not (bearer_matches(authorization, self.token) or given_key):
            await self._answer(send, scope["path"], "wrong token")
            return
        scope[AUTHENTICATED] = True
        await self.app(scope, receive, send)

    async def _answer(self, send: Send, path: str, message: str) -> None:
        body = self.refuse(path, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
