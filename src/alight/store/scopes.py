"""What the store server lets a request do beyond its token: credentials, scopes, secret redaction.

With a token, each route names the kinds of credential it serves (`StoreAccess.allowing`; see
`alight.serving.credentials` for the three kinds): the admin token does everything; a runner
credential claims rollouts in its own name and writes (start, heartbeat, finish, spans, OTLP) only
into attempts claimed in that name; an agent key writes only its own attempt's spans, and only when
the server lets agents write spans (`agent_spans`). Each claim mints the attempt's agent key, which
is refused once the attempt has ended. Without a token (loopback only), a runner may name itself in
`X-Alight-Runner` and its writes into other runners' attempts are refused; other requests are not
runner-scoped. Resources read back by a request that did not prove the token or a runner
credential have their secrets (`LLMResource.api_key`) removed.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import orjson
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from alight.errors import ForbiddenError, NotFoundError
from alight.serving.app import Handler
from alight.serving.auth import GRANT, RUNNER_HEADER
from alight.serving.credentials import Credentials, Grant, Kind, check_runner_name
from alight.store.base import Store
from alight.types import Claim, LLMResource, ResourceSet, Span

_REMEMBERED_OWNERS = 65536
#: How long an agent key's attempt, once read as running, is trusted to run without another store
#: read (seconds); the ends the server itself sees revoke the key at once.
AGENT_RECHECK_S = 2.0
_Set = TypeVar("_Set", ResourceSet, ResourceSet | None)
_T = TypeVar("_T")

ADMIN_ONLY: frozenset[Kind] = frozenset({"admin"})
RUNNERS: frozenset[Kind] = frozenset({"admin", "runner"})
WRITERS: frozenset[Kind] = frozenset({"admin", "runner", "agent"})


class RunnerBody(BaseModel):
    """POST /store/runners: the name of the runner to mint a credential for."""

    model_config = ConfigDict(extra="forbid")
    name: str


class CredentialBody(BaseModel):
    """POST /store/credentials/check: a credential presented to another server (the proxy)."""

    model_config = ConfigDict(extra="forbid")
    credential: str


class RunnerScopes:
    """The runner recorded on each attempt at claim time (which never changes afterwards, so owners
    are remembered: one store read per attempt)."""

    def __init__(self, store: Store, size: int = _REMEMBERED_OWNERS) -> None:
        self._store = store
        self._size = size
        self._owners: OrderedDict[str, str | None] = OrderedDict()

    def remember(self, attempt_id: str, owner: str | None) -> None:
        """Record the runner that just claimed `attempt_id` (saves the store read of `owner`)."""
        self._owners[attempt_id] = owner
        if len(self._owners) > self._size:
            self._owners.popitem(last=False)

    async def owner(self, attempt_id: str) -> str | None:
        """The runner that claimed `attempt_id` (NotFoundError for an unknown attempt)."""
        if attempt_id in self._owners:
            return self._owners[attempt_id]
        owner = (await self._store.get_attempt(attempt_id)).worker_id
        self.remember(attempt_id, owner)
        return owner

    async def check(self, runner: str | None, attempt_ids: Iterable[str]) -> None:
        """ForbiddenError when `runner` (None: not runner-scoped) writes into another's attempt.
        Unknown attempts pass: the store itself answers them."""
        if runner is None:
            return
        for attempt_id in dict.fromkeys(attempt_ids):
            try:
                owner = await self.owner(attempt_id)
            except NotFoundError:
                continue
            if owner != runner:
                raise ForbiddenError(f"attempt {attempt_id!r} is claimed by another runner, not {runner!r}")


class StoreAccess:
    """The store server's checks of who may do what (see the module docstring). With `token`,
    credentials are minted and checked; without, only `X-Alight-Runner` scopes writes."""

    def __init__(self, store: Store, token: str | None = None, *, agent_spans: bool = False) -> None:
        self.store = store
        self.credentials = Credentials(token) if token is not None else None
        self.agent_spans = agent_spans
        self.scopes = RunnerScopes(store)
        self._live: OrderedDict[str, float] = OrderedDict()  # attempt id -> when the store last said it runs

    async def resolve(self, secret: str) -> Grant | None:
        """What `secret` may do; an agent key of an attempt that has ended (or is unknown) is none.
        Ends this server sees (finish, cancel, reap, its watchdog) revoke a key at once; any other
        (a writer beside this server on its SQLite file) within `AGENT_RECHECK_S`."""
        assert self.credentials is not None
        grant = self.credentials.lookup(secret)
        if grant is None or grant.kind != "agent" or grant.attempt_id is None:
            return grant
        checked = self._live.get(grant.attempt_id)
        now = time.monotonic()
        if checked is not None and now - checked < AGENT_RECHECK_S:
            return grant
        try:
            attempt = await self.store.get_attempt(grant.attempt_id)
        except NotFoundError:
            attempt = None
        if attempt is None or attempt.status.is_terminal:
            self.ended(grant.attempt_id)
            return None
        self._live[grant.attempt_id] = now
        self._live.move_to_end(grant.attempt_id)
        if len(self._live) > _REMEMBERED_OWNERS:
            self._live.popitem(last=False)
        return grant

    def allowing(
        self, kinds: frozenset[Kind], handler: Callable[[Request], Awaitable[_T]]
    ) -> Callable[[Request], Awaitable[_T]]:
        """`handler`, answered 403 for a credential whose kind is not in `kinds`."""

        async def checked(request: Request) -> _T:
            grant: Grant | None = request.scope.get(GRANT)
            if grant is not None and grant.kind not in kinds:
                raise ForbiddenError(f"{request.method} {request.url.path} is not open to a {grant.kind} credential")
            return await handler(request)

        return checked

    def claimant(self, request: Request, worker_id: str | None) -> str | None:
        """The worker a claim is recorded for: a runner credential claims only in its own name
        (or a worker's under it, `<name>/<worker>`); without a token, as `X-Alight-Runner` says."""
        grant: Grant | None = request.scope.get(GRANT)
        if grant is None:
            named = request.headers.get(RUNNER_HEADER)
            worker_id = worker_id or named
            if named not in (None, worker_id):
                raise ForbiddenError(f"runner {named!r} cannot claim for worker {worker_id!r}")
            return worker_id
        if grant.kind != "runner":
            return worker_id
        worker_id = worker_id or grant.name
        if not grant.holds(worker_id):
            raise ForbiddenError(f"runner {grant.name!r} cannot claim for worker {worker_id!r}")
        return worker_id

    def with_agent_key(self, request: Request, claim: Claim | None) -> Claim | None:
        """`claim` carrying its attempt's new agent key (as it is when the server has no token)."""
        if claim is None or self.credentials is None:
            return claim
        self.scopes.remember(claim.attempt.attempt_id, claim.attempt.worker_id)
        key = self.credentials.mint_agent(claim.rollout.rollout_id, claim.attempt.attempt_id, spans=self.agent_spans)
        return claim.model_copy(update={"agent_key": key})

    def ended(self, *attempt_ids: str, rollout_id: str | None = None) -> None:
        """These attempts (or every attempt of `rollout_id`) ended: their agent keys go at once."""
        if self.credentials is None:
            return
        for attempt_id in attempt_ids:
            self.credentials.revoke(attempt_id)
            self._live.pop(attempt_id, None)
        if rollout_id is not None:
            self.credentials.revoke_rollout(rollout_id)

    async def check_attempts(self, request: Request, attempt_ids: Iterable[str]) -> None:
        """ForbiddenError unless the request may write into every one of `attempt_ids`. Unknown
        attempts pass (the store answers them)."""
        grant: Grant | None = request.scope.get(GRANT)
        if grant is None:
            await self.scopes.check(request.headers.get(RUNNER_HEADER), attempt_ids)
            return
        if grant.kind == "admin":
            return
        for attempt_id in dict.fromkeys(attempt_ids):
            if grant.kind == "agent":
                if attempt_id != grant.attempt_id:
                    raise ForbiddenError(f"this agent key is for attempt {grant.attempt_id!r}, not {attempt_id!r}")
                continue
            try:
                owner = await self.scopes.owner(attempt_id)
            except NotFoundError:
                continue
            if not grant.holds(owner):
                raise ForbiddenError(f"attempt {attempt_id!r} is claimed by another runner, not {grant.name!r}")

    async def check_spans(self, request: Request, spans: Iterable[Span]) -> None:
        """ForbiddenError unless the request may write every one of `spans`: an agent key only its
        own attempt's, and only where agents may write spans."""
        spans = list(spans)
        grant: Grant | None = request.scope.get(GRANT)
        if grant is not None and grant.kind == "agent":
            if not grant.spans:
                raise ForbiddenError("agents may not write spans on this store (the server sets agent_spans)")
            if any(span.rollout_id != grant.rollout_id for span in spans):
                raise ForbiddenError(f"this agent key is for rollout {grant.rollout_id!r} only")
        await self.check_attempts(request, (span.attempt_id for span in spans))

    async def check_read(self, request: Request, rollout_id: str, attempt_id: str | None) -> None:
        """A runner reads spans of its own attempts only (one attempt per request)."""
        grant: Grant | None = request.scope.get(GRANT)
        if grant is None or grant.kind == "admin":
            return
        if attempt_id is None or grant.kind != "runner":
            raise ForbiddenError("a runner credential reads one attempt's spans at a time: pass attempt_id")
        await self.check_attempts(request, (attempt_id,))

    def routes(self, body: Callable[[Request], Awaitable[bytes]]) -> list[tuple[str, Handler, str, type[BaseModel]]]:
        """The credential routes (admin only): (path, handler, summary, body model) each, reading
        bodies with `body`. `POST /store/runners` mints a runner credential; `POST
        /store/credentials/check` says what a credential may do (for the proxy, which checks agent keys)."""

        async def register(request: Request) -> bytes:
            name = check_runner_name(RunnerBody.model_validate_json(await body(request) or b"{}").name)
            if self.credentials is None:
                raise ForbiddenError("this store server has no token: runners need no credential")
            return orjson.dumps({"name": name, "credential": self.credentials.mint_runner(name)})

        async def check(request: Request) -> bytes:
            secret = CredentialBody.model_validate_json(await body(request) or b"{}").credential
            grant = await self.resolve(secret) if self.credentials is not None else None
            return orjson.dumps({"grant": None if grant is None else dataclasses.asdict(grant)})

        return [
            ("/store/runners", register, "a new runner credential", RunnerBody),
            ("/store/credentials/check", check, "what a credential may do", CredentialBody),
        ]


def without_secrets(resource_set: _Set) -> _Set:
    """`resource_set` with every LLM resource's `api_key` removed (None)."""
    if resource_set is None or not any(
        isinstance(r, LLMResource) and r.api_key is not None for r in resource_set.resources.values()
    ):
        return resource_set
    resources = {
        name: resource.model_copy(update={"api_key": None}) if isinstance(resource, LLMResource) else resource
        for name, resource in resource_set.resources.items()
    }
    return resource_set.model_copy(update={"resources": resources})
