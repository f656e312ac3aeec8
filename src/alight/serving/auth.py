"""Authentication of alight's servers: the operator's token, the credentials minted from it, and
where a token may be left out.

The store server, the LLM proxy and `alight serve` bind 127.0.0.1 by default. Binding any other
address needs a token (`--token` or the `ALIGHT_TOKEN` variable), or `--insecure` (a warning).
With a token, every route but `GET /health` asks for `Authorization: Bearer <credential>` (what
the OpenAI client sends for its `api_key`) or `x-api-key: <credential>` (what Anthropic clients
send): the token itself, or a runner credential or agent key minted from it
(`alight.serving.credentials`); anything else is answered 401 before the route runs, and the
`Grant` of what was presented is left in the request's scope for the routes to check (403).
Without a token (loopback only), runners name themselves in `X-Alight-Runner`, as a courtesy.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from alight.errors import ConfigError
from alight.serving.credentials import ADMIN, RUNNER_CREDENTIAL_ENV, Grant

logger = logging.getLogger(__name__)

#: The environment variable servers and clients read the token from when none is given.
TOKEN_ENV = "ALIGHT_TOKEN"
#: The header a runner names itself in; the store checks it against the attempt's claimant.
RUNNER_HEADER = "x-alight-runner"
#: Paths a server answers without a token: liveness only, nothing read or written.
OPEN_PATHS = frozenset({"/health"})
#: Set in the ASGI scope of a request whose token (or runner credential) was checked.
AUTHENTICATED = "alight.authenticated"
#: The `Grant` of the request's credential, in its ASGI scope (absent on a server without a token).
GRANT = "alight.grant"
#: Finds what a presented credential may do (None: nothing, answered 401).
Resolve = Callable[[str], Awaitable[Grant | None]]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def resolve_token(token: str | None = None) -> str | None:
    """`token`, else the `ALIGHT_TOKEN` variable; None for neither (an empty value counts as none)."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    return value or None


def runner_token(token: str | None = None) -> str | None:
    """What a runner pool presents to the store: `token`, else the `ALIGHT_RUNNER_CREDENTIAL`
    variable, else `ALIGHT_TOKEN` (None for none; an empty value counts as none)."""
    if token is not None:
        return token or None
    return os.environ.get(RUNNER_CREDENTIAL_ENV) or os.environ.get(TOKEN_ENV) or None


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


def presented(headers: Any) -> str | None:
    """The credential an ASGI request presents: its bearer, else its `x-api-key` (None for neither;
    "" for an Authorization header of another scheme)."""
    authorization: str | None = None
    api_key: str | None = None
    for name, value in headers:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"x-api-key":
            api_key = value.decode("latin-1").strip()
    if authorization is not None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer":
            return given.strip()
        return api_key if api_key is not None else ""
    return api_key


class BearerAuth:
    """ASGI middleware: HTTP requests outside `OPEN_PATHS` need a credential (bearer, or
    `x-api-key`): the token, or one `resolve` knows; else `refuse(path, message)` answers (status
    401) and the app never sees the request. The credential's `Grant` goes into the scope (`GRANT`)."""

    def __init__(
        self, app: ASGIApp, token: str, refuse: Callable[[str, str], bytes], resolve: Resolve | None = None
    ) -> None:
        self.app = app
        self.token = token
        self.refuse = refuse
        self.resolve = resolve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = presented(scope["headers"])
        if given is None:
            await self._answer(send, scope["path"], "missing Authorization: Bearer token (or x-api-key)")
            return
        grant: Grant | None = None
        if hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token.encode("utf-8", "surrogatepass")):
            grant = ADMIN
        elif self.resolve is not None and given:
            try:
                grant = await self.resolve(given)
            except Exception as err:  # the store that knows the keys is away: refuse, do not fail
                logger.warning("cannot check a credential on %s: %s", scope["path"], err)
                await self._answer(send, scope["path"], "the credential cannot be checked now", status=503)
                return
        if grant is None:
            await self._answer(send, scope["path"], "wrong token")
            return
        scope[GRANT] = grant
        scope[AUTHENTICATED] = grant.kind != "agent"
        await self.app(scope, receive, send)

    async def _answer(self, send: Send, path: str, message: str, status: int = 401) -> None:
        body = self.refuse(path, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
