"""The store server's routes: one handler per `Store` method, and `ROUTES`, the table that serves them.

Each handler takes what the app's routes share (`StoreApp`: the store, the access checks, the
`ServerApp` and its limits) and the request. `ROUTES` gives each its path, method, OpenAPI summary
and body model, the credentials it serves, and whether a retry with the same idempotency key gets
the first answer back; `alight.store.server.create_app` binds a `StoreApp` and registers the table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from alight.errors import AlightError, InvalidRequestError, one_line
from alight.serving.app import ServerApp, unless_disconnected
from alight.serving.credentials import Kind
from alight.store import wire
from alight.store.base import ALL_ATTEMPTS, Store
from alight.store.columns import MEDIA_TYPE as COLUMNS_MEDIA_TYPE
from alight.store.columns import encode_columns, gc_paused
from alight.store.otlp import receive_traces  # opentelemetry-proto loads on the first request
from alight.store.scopes import ADMIN_ONLY, RUNNERS, WRITERS, StoreAccess, without_secrets
from alight.store.wire import IDEMPOTENCY_HEADER
from alight.types import ResourceSet


@dataclass(frozen=True)
class StoreApp:
    """What a store app's handlers share: the store, who may do what, the app and its limits."""

    store: Store
    access: StoreAccess
    server: ServerApp
    max_wait_s: float
    max_body_bytes: int

    async def body(self, request: Request) -> bytes:
        """The request body, refused past the app's `max_body_bytes`."""
        return await self.server.body(request)

    async def own_attempt(self, request: Request) -> str:
        """The path's attempt id, once the request's credential may write into that attempt."""
        attempt_id: str = request.path_params["attempt_id"]
        await self.access.check_attempts(request, (attempt_id,))
        return attempt_id

    def readable(self, resources: ResourceSet | None, request: Request) -> ResourceSet | None:
        """`resources` as the request may read them: without secrets unless it proved the token."""
        return resources if self.server.authenticated(request) else without_secrets(resources)


#: A route's handler: the answer to `request`, served from `app`.
StoreHandler = Callable[[StoreApp, Request], Awaitable[Response | bytes]]


# -- queue ----------------------------------------------------------------------------------------
async def enqueue(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.EnqueueBody, await app.body(request))
    return wire.ROLLOUTS.dump_json(await app.store.enqueue(parsed.rollouts))


async def dequeue(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.DequeueBody, await app.body(request))
    claim = await app.store.dequeue(app.access.claimant(request, parsed.worker_id), attempt_id=parsed.attempt_id)
    return wire.MAYBE_CLAIM.dump_json(app.access.with_agent_key(request, claim))


async def start_attempt(app: StoreApp, request: Request) -> bytes:
    return wire.ATTEMPT.dump_json(await app.store.start_attempt(await app.own_attempt(request)))


async def heartbeat(app: StoreApp, request: Request) -> bytes:
    return wire.ATTEMPT.dump_json(await app.store.heartbeat(await app.own_attempt(request)))


async def get_attempt(app: StoreApp, request: Request) -> bytes:
    return wire.ATTEMPT.dump_json(await app.store.get_attempt(await app.own_attempt(request)))


async def finish_attempt(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.FinishAttemptBody, await app.body(request))
    attempt_id = await app.own_attempt(request)
    rollout = await app.store.finish_attempt(attempt_id, parsed.status, reward=parsed.reward, error=parsed.error)
    app.access.ended(attempt_id)
    return wire.ROLLOUT.dump_json(rollout)


async def finish_rollout(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.FinishRolloutBody, await app.body(request))
    rollout = await app.store.finish_rollout(request.path_params["rollout_id"], parsed.status, reward=parsed.reward)
    app.access.ended(rollout_id=rollout.rollout_id)
    return wire.ROLLOUT.dump_json(rollout)


# -- spans ----------------------------------------------------------------------------------------
async def add_spans(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.SpansBody, await app.body(request))
    key = request.headers.get(IDEMPOTENCY_HEADER)  # the store keeps each part's count by it (a restart)

    def write_id(part: str) -> str | None:
        return None if key is None else f"spans {key}{part}"

    if parsed.groups is None:
        await app.access.check_spans(request, parsed.spans)
        return orjson.dumps({"added": await app.store.add_spans(parsed.spans, write_id=write_id(""))})
    if sum(parsed.groups) != len(parsed.spans):
        raise InvalidRequestError(f"groups add up to {sum(parsed.groups)} spans, the request has {len(parsed.spans)}")
    answers: list[dict[str, Any]] = []
    total = start = 0
    for number, size in enumerate(parsed.groups):
        try:
            group = parsed.spans[start : start + size]
            await app.access.check_spans(request, group)
            added = await app.store.add_spans(group, write_id=write_id(f" #{number}"))
        except AlightError as err:
            answers.append({"error": {"code": err.code, "message": one_line(str(err))}})
        else:
            answers.append({"added": added})
            total += added
        start += size
    return orjson.dumps({"added": total, "groups": answers})


async def query_spans(app: StoreApp, request: Request) -> bytes:
    attempt_id = request.query_params.get("attempt_id")
    await app.access.check_read(request, request.path_params["rollout_id"], attempt_id)
    spans = await app.store.query_spans(
        request.path_params["rollout_id"], ALL_ATTEMPTS if attempt_id == ALL_ATTEMPTS else attempt_id
    )
    return wire.SPANS.dump_json(spans)


# -- bulk reads: the trainer's, one request for a whole step -------------------------------------
async def bulk_rollouts(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.BulkReadBody, await app.body(request))
    return orjson.dumps(await app.store.rollout_dicts(parsed.rollout_ids))


async def bulk_spans(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.BulkReadBody, await app.body(request))
    spans = await app.store.span_dicts(parsed.rollout_ids, all_attempts=parsed.all_attempts, arrays=parsed.arrays)
    return orjson.dumps(spans, option=orjson.OPT_SERIALIZE_NUMPY)


async def bulk_columns(app: StoreApp, request: Request) -> Response:
    parsed = wire.parse_body(wire.BulkReadBody, await app.body(request))
    with gc_paused():
        columns = await app.store.llm_columns(parsed.rollout_ids, tool_spans=parsed.tool_spans)
        return Response(encode_columns(columns), media_type=COLUMNS_MEDIA_TYPE)


# -- reading --------------------------------------------------------------------------------------
async def get_rollout(app: StoreApp, request: Request) -> bytes:
    return wire.ROLLOUT.dump_json(await app.store.get_rollout(request.path_params["rollout_id"]))


async def _run_query(app: StoreApp, query: wire.QueryBody) -> bytes:
    rollouts = await app.store.list_rollouts(
        status=query.status,
        ids=query.ids,
        mode=query.mode,
        group_id=query.group_id,
        limit=query.limit,
        offset=query.offset,
    )
    return wire.ROLLOUTS.dump_json(rollouts)


async def list_rollouts(app: StoreApp, request: Request) -> bytes:
    params = request.query_params
    raw: dict[str, Any] = {key: params.get(key) for key in ("mode", "group_id", "limit") if key in params}
    raw["offset"] = params.get("offset", "0")
    for key in ("status", "ids"):
        if key in params:
            raw[key] = params.getlist(key)
    return await _run_query(app, wire.body_adapter(wire.QueryBody).validate_python(raw))


async def query_rollouts(app: StoreApp, request: Request) -> bytes:
    return await _run_query(app, wire.parse_body(wire.QueryBody, await app.body(request)))


async def list_attempts(app: StoreApp, request: Request) -> bytes:
    return wire.ATTEMPTS.dump_json(await app.store.list_attempts(request.path_params["rollout_id"]))


async def counts(app: StoreApp, request: Request) -> bytes:
    return orjson.dumps({status.value: n for status, n in (await app.store.count_by_status()).items()})


async def wait(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.WaitBody, await app.body(request))
    waiting = app.store.wait_for_rollouts(parsed.rollout_ids, min(parsed.timeout, app.max_wait_s))
    return wire.ROLLOUTS.dump_json(await unless_disconnected(request, waiting))


# -- resources ------------------------------------------------------------------------------------
async def add_resources(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.ResourcesBody, await app.body(request))
    write_id = request.headers.get(IDEMPOTENCY_HEADER)
    return wire.RESOURCE_SET.dump_json(await app.store.add_resources(parsed.resources, write_id=write_id))


async def latest_resources(app: StoreApp, request: Request) -> bytes:
    return wire.MAYBE_RESOURCE_SET.dump_json(app.readable(await app.store.get_latest_resources(), request))


async def get_resources(app: StoreApp, request: Request) -> bytes:
    version = request.path_params["version"]
    try:
        number = int(version)
    except ValueError:
        raise InvalidRequestError(f"resources version must be an integer, got {version!r}") from None
    if not -(2**63) <= number < 2**63:
        raise InvalidRequestError(f"resources version {version} is out of range") from None
    resources = await app.store.get_resources(number)
    return wire.RESOURCE_SET.dump_json(resources if app.server.authenticated(request) else without_secrets(resources))


# -- upkeep ---------------------------------------------------------------------------------------
async def reap(app: StoreApp, request: Request) -> bytes:
    parsed = wire.parse_body(wire.ReapBody, await app.body(request))
    write_id = request.headers.get(IDEMPOTENCY_HEADER)
    reaped = await app.store.reap_timed_out(parsed.at, write_id=write_id)
    app.access.ended(*(attempt.attempt_id for attempt in reaped))
    return wire.ATTEMPTS.dump_json(reaped)


async def health(app: StoreApp, request: Request) -> bytes:
    return b'{"status":"ok"}'


# -- OTLP/HTTP: spans from any OpenTelemetry SDK or Collector (protobuf or JSON) ------------------
async def otlp_traces(app: StoreApp, request: Request) -> Response:
    try:
        answer, media_type = await receive_traces(
            app.store,
            await app.body(request),
            request.headers.get("content-type"),
            request.headers.get("content-encoding"),
            max_bytes=app.max_body_bytes,
            check=lambda spans: app.access.check_spans(request, spans),
        )
    except InvalidRequestError as err:  # OTLP/HTTP answers a bad export with 400, not 422
        return app.server.error(400, err.code, str(err))
    return Response(answer, media_type=media_type)


# -- the table ------------------------------------------------------------------------------------
class StoreRoute(NamedTuple):
    """One route of the store server: where, what it runs, how OpenAPI describes it, who may call it."""

    path: str
    method: str
    handler: StoreHandler
    summary: str
    body_model: type[BaseModel] | None = None
    query: dict[str, dict[str, Any]] | None = None  # parameter name -> JSON schema
    idempotent: bool = False  # a retry with the same idempotency key gets the first answer
    who: frozenset[Kind] = ADMIN_ONLY


#: Every route but the credential ones (`StoreAccess.routes`), in the order they are registered.
ROUTES: tuple[StoreRoute, ...] = (
    StoreRoute("/store/enqueue", "POST", enqueue, "enqueue rollouts", wire.EnqueueBody),
    StoreRoute("/store/dequeue", "POST", dequeue, "claim the next rollout", wire.DequeueBody, who=RUNNERS),
    StoreRoute("/store/attempts/{attempt_id}", "GET", get_attempt, "an attempt", who=RUNNERS),
    StoreRoute("/store/attempts/{attempt_id}/start", "POST", start_attempt, "mark an attempt running", who=RUNNERS),
    StoreRoute("/store/attempts/{attempt_id}/heartbeat", "POST", heartbeat, "an attempt's heartbeat", who=RUNNERS),
    StoreRoute(
        "/store/attempts/{attempt_id}/finish",
        "POST",
        finish_attempt,
        "end an attempt",
        wire.FinishAttemptBody,
        who=RUNNERS,
    ),
    StoreRoute("/store/rollouts/{rollout_id}/finish", "POST", finish_rollout, "end a rollout", wire.FinishRolloutBody),
    StoreRoute("/store/spans", "POST", add_spans, "add spans", wire.SpansBody, idempotent=True, who=WRITERS),
    StoreRoute("/store/rollouts", "GET", list_rollouts, "list rollouts", query=wire.LIST_QUERY),
    StoreRoute("/store/rollouts/query", "POST", query_rollouts, "list rollouts", wire.QueryBody),
    StoreRoute("/store/rollouts/{rollout_id}", "GET", get_rollout, "a rollout"),
    StoreRoute("/store/rollouts/{rollout_id}/attempts", "GET", list_attempts, "a rollout's attempts"),
    StoreRoute(
        "/store/rollouts/{rollout_id}/spans",
        "GET",
        query_spans,
        "a rollout's spans",
        query=wire.SPANS_QUERY,
        who=RUNNERS,
    ),
    StoreRoute("/store/wait", "POST", wait, "wait for rollouts to end", wire.WaitBody),
    StoreRoute("/store/bulk/rollouts", "POST", bulk_rollouts, "rollouts as dicts", wire.BulkReadBody),
    StoreRoute("/store/bulk/spans", "POST", bulk_spans, "spans as dicts", wire.BulkReadBody),
    StoreRoute("/store/bulk/columns", "POST", bulk_columns, "LLM spans as columns", wire.BulkReadBody),
    StoreRoute("/store/resources", "POST", add_resources, "publish resources", wire.ResourcesBody, idempotent=True),
    StoreRoute("/store/resources/latest", "GET", latest_resources, "the latest resources", who=RUNNERS),
    StoreRoute("/store/resources/{version}", "GET", get_resources, "resources by version", who=RUNNERS),
    StoreRoute("/store/counts", "GET", counts, "rollouts by status", who=RUNNERS),
    StoreRoute("/store/reap", "POST", reap, "time out silent attempts", wire.ReapBody, idempotent=True),
    StoreRoute("/health", "GET", health, "health"),
    StoreRoute(
        "/v1/traces", "POST", otlp_traces, "OTLP/HTTP trace export (protobuf or JSON)", wire.OtlpTracesBody, who=WRITERS
    ),
)
