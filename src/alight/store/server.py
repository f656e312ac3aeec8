"""The HTTP store server: any `Store` behind JSON routes, for runners in other processes or hosts.

One route per `Store` method (see `create_app`), on the app every alight server starts from
(`alight.serving.app.ServerApp`). Errors travel as `{"error": {"code": ..., "message": ...}}` with
the status of the `AlightError` class, so the client (`alight.store.client.StoreClient`) raises
what the store raised. Hot routes skip FastAPI's body and response models: they read bytes,
validate them with cached pydantic adapters, and answer bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import fastapi
import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from alight.errors import AlightError, ConfigError, InvalidRequestError, StoreError, one_line
from alight.serving.app import DEFAULT_MAX_BODY_BYTES, Handler, ServerApp, unless_disconnected
from alight.serving.auth import check_bind
from alight.serving.background import BackgroundServer
from alight.serving.credentials import Kind
from alight.serving.openapi import Operation
from alight.store import wire
from alight.store.base import ALL_ATTEMPTS, Store
from alight.store.columns import MEDIA_TYPE as COLUMNS_MEDIA_TYPE
from alight.store.columns import encode_columns, gc_paused
from alight.store.otlp import receive_traces  # opentelemetry-proto loads on the first request
from alight.store.remembered import RememberedAnswers
from alight.store.scopes import ADMIN_ONLY, RUNNERS, WRITERS, StoreAccess, without_secrets
from alight.store.wire import IDEMPOTENCY_HEADER
from alight.types import ResourceSet

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

    @contextlib.asynccontextmanager
    async def watchdog() -> AsyncIterator[None]:
        task = None
        if watchdog_interval_s is not None:
            task = asyncio.create_task(_watchdog(store, watchdog_interval_s, access), name="alight-store-watchdog")
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    access = StoreAccess(store, token, agent_spans=agent_spans)
    server = ServerApp(
        "store server", error_body=_error_body, lifespan=watchdog, max_body_bytes=max_body_bytes, token=token,
        resolve=access.resolve if token is not None else None,
    )  # fmt: skip
    remembered = RememberedAnswers(server)

    async def own_attempt(request: Request) -> str:
        attempt_id: str = request.path_params["attempt_id"]
        await access.check_attempts(request, (attempt_id,))
        return attempt_id

    def readable(resources: ResourceSet | None, request: Request) -> ResourceSet | None:
        return resources if server.authenticated(request) else without_secrets(resources)

    operations: list[Operation] = []

    def route(
        path: str,
        method: str,
        handler: Handler,
        summary: str,
        body_model: type[BaseModel] | None = None,
        *,
        query: dict[str, dict[str, Any]] | None = None,
        idempotent: bool = False,
        who: frozenset[Kind] = ADMIN_ONLY,
    ) -> None:
        endpoint = server.guard(access.allowing(who, handler))
        server.app.add_route(path, remembered.wrap(endpoint) if idempotent else endpoint, methods=[method])
        operations.append(Operation(path, method, summary, body_model, query or {}))

    body = server.body

    # -- queue ----------------------------------------------------------------------------
    async def enqueue(request: Request) -> bytes:
        parsed = wire.parse_body(wire.EnqueueBody, await body(request))
        return wire.ROLLOUTS.dump_json(await store.enqueue(parsed.rollouts))

    async def dequeue(request: Request) -> bytes:
        parsed = wire.parse_body(wire.DequeueBody, await body(request))
        claim = await store.dequeue(access.claimant(request, parsed.worker_id), attempt_id=parsed.attempt_id)
        return wire.MAYBE_CLAIM.dump_json(access.with_agent_key(request, claim))

    async def start_attempt(request: Request) -> bytes:
        return wire.ATTEMPT.dump_json(await store.start_attempt(await own_attempt(request)))

    async def heartbeat(request: Request) -> bytes:
        return wire.ATTEMPT.dump_json(await store.heartbeat(await own_attempt(request)))

    async def get_attempt(request: Request) -> bytes:
        return wire.ATTEMPT.dump_json(await store.get_attempt(await own_attempt(request)))

    async def finish_attempt(request: Request) -> bytes:
        parsed = wire.parse_body(wire.FinishAttemptBody, await body(request))
        attempt_id = await own_attempt(request)
        rollout = await store.finish_attempt(attempt_id, parsed.status, reward=parsed.reward, error=parsed.error)
        access.ended(attempt_id)
        return wire.ROLLOUT.dump_json(rollout)

    async def finish_rollout(request: Request) -> bytes:
        parsed = wire.parse_body(wire.FinishRolloutBody, await body(request))
        rollout = await store.finish_rollout(request.path_params["rollout_id"], parsed.status, reward=parsed.reward)
        access.ended(rollout_id=rollout.rollout_id)
        return wire.ROLLOUT.dump_json(rollout)

    # -- spans ----------------------------------------------------------------------------
    async def add_spans(request: Request) -> bytes:
        parsed = wire.parse_body(wire.SpansBody, await body(request))
        key = request.headers.get(IDEMPOTENCY_HEADER)  # the store keeps each part's count by it (a restart)

        def write_id(part: str) -> str | None:
            return None if key is None else f"spans {key}{part}"

        if parsed.groups is None:
            await access.check_spans(request, parsed.spans)
            return orjson.dumps({"added": await store.add_spans(parsed.spans, write_id=write_id(""))})
        if sum(parsed.groups) != len(parsed.spans):
            raise InvalidRequestError(
                f"groups add up to {sum(parsed.groups)} spans, the request has {len(parsed.spans)}"
            )
        answers: list[dict[str, Any]] = []
        total = start = 0
        for number, size in enumerate(parsed.groups):
            try:
                group = parsed.spans[start : start + size]
                await access.check_spans(request, group)
                added = await store.add_spans(group, write_id=write_id(f" #{number}"))
            except AlightError as err:
                answers.append({"error": {"code": err.code, "message": one_line(str(err))}})
            else:
                answers.append({"added": added})
                total += added
            start += size
        return orjson.dumps({"added": total, "groups": answers})

    async def query_spans(request: Request) -> bytes:
        attempt_id = request.query_params.get("attempt_id")
        await access.check_read(request, request.path_params["rollout_id"], attempt_id)
        spans = await store.query_spans(
            request.path_params["rollout_id"], ALL_ATTEMPTS if attempt_id == ALL_ATTEMPTS else attempt_id
        )
        return wire.SPANS.dump_json(spans)

    # -- bulk reads: the trainer's, one request for a whole step -------------------------
    async def bulk_rollouts(request: Request) -> bytes:
        parsed = wire.parse_body(wire.BulkReadBody, await body(request))
        return orjson.dumps(await store.rollout_dicts(parsed.rollout_ids))

    async def bulk_spans(request: Request) -> bytes:
        parsed = wire.parse_body(wire.BulkReadBody, await body(request))
        spans = await store.span_dicts(parsed.rollout_ids, all_attempts=parsed.all_attempts, arrays=parsed.arrays)
        return orjson.dumps(spans, option=orjson.OPT_SERIALIZE_NUMPY)

    async def bulk_columns(request: Request) -> Response:
        parsed = wire.parse_body(wire.BulkReadBody, await body(request))
        with gc_paused():
            columns = await store.llm_columns(parsed.rollout_ids, tool_spans=parsed.tool_spans)
            return Response(encode_columns(columns), media_type=COLUMNS_MEDIA_TYPE)

    # -- reading --------------------------------------------------------------------------
    async def get_rollout(request: Request) -> bytes:
        return wire.ROLLOUT.dump_json(await store.get_rollout(request.path_params["rollout_id"]))

    async def run_query(query: wire.QueryBody) -> bytes:
        rollouts = await store.list_rollouts(
            status=query.status,
            ids=query.ids,
            mode=query.mode,
            group_id=query.group_id,
            limit=query.limit,
            offset=query.offset,
        )
        return wire.ROLLOUTS.dump_json(rollouts)

    async def list_rollouts(request: Request) -> bytes:
        params = request.query_params
        raw: dict[str, Any] = {key: params.get(key) for key in ("mode", "group_id", "limit") if key in params}
        raw["offset"] = params.get("offset", "0")
        for key in ("status", "ids"):
            if key in params:
                raw[key] = params.getlist(key)
        return await run_query(wire.body_adapter(wire.QueryBody).validate_python(raw))

    async def query_rollouts(request: Request) -> bytes:
        return await run_query(wire.parse_body(wire.QueryBody, await body(request)))

    async def list_attempts(request: Request) -> bytes:
        return wire.ATTEMPTS.dump_json(await store.list_attempts(request.path_params["rollout_id"]))

    async def counts(request: Request) -> bytes:
        return orjson.dumps({status.value: n for status, n in (await store.count_by_status()).items()})

    check_max_wait(max_wait_s)

    async def wait(request: Request) -> bytes:
        parsed = wire.parse_body(wire.WaitBody, await body(request))
        waiting = store.wait_for_rollouts(parsed.rollout_ids, min(parsed.timeout, max_wait_s))
        return wire.ROLLOUTS.dump_json(await unless_disconnected(request, waiting))

    # -- resources ------------------------------------------------------------------------
    async def add_resources(request: Request) -> bytes:
        parsed = wire.parse_body(wire.ResourcesBody, await body(request))
        write_id = request.headers.get(IDEMPOTENCY_HEADER)
        return wire.RESOURCE_SET.dump_json(await store.add_resources(parsed.resources, write_id=write_id))

    async def latest_resources(request: Request) -> bytes:
        return wire.MAYBE_RESOURCE_SET.dump_json(readable(await store.get_latest_resources(), request))

    async def get_resources(request: Request) -> bytes:
        version = request.path_params["version"]
        try:
            number = int(version)
        except ValueError:
            raise InvalidRequestError(f"resources version must be an integer, got {version!r}") from None
        if not -(2**63) <= number < 2**63:
            raise InvalidRequestError(f"resources version {version} is out of range") from None
        resources = await store.get_resources(number)
        return wire.RESOURCE_SET.dump_json(resources if server.authenticated(request) else without_secrets(resources))

    # -- upkeep ---------------------------------------------------------------------------
    async def reap(request: Request) -> bytes:
        parsed = wire.parse_body(wire.ReapBody, await body(request))
        write_id = request.headers.get(IDEMPOTENCY_HEADER)
        reaped = await store.reap_timed_out(parsed.at, write_id=write_id)
        access.ended(*(attempt.attempt_id for attempt in reaped))
        return wire.ATTEMPTS.dump_json(reaped)

    async def health(request: Request) -> bytes:
        return b'{"status":"ok"}'

    # -- OTLP/HTTP: spans from any OpenTelemetry SDK or Collector (protobuf or JSON) ----------
    async def otlp_traces(request: Request) -> Response:
        try:
            answer, media_type = await receive_traces(
                store,
                await body(request),
                request.headers.get("content-type"),
                request.headers.get("content-encoding"),
                max_bytes=max_body_bytes,
                check=lambda spans: access.check_spans(request, spans),
            )
        except InvalidRequestError as err:  # OTLP/HTTP answers a bad export with 400, not 422
            return server.error(400, err.code, str(err))
        return Response(answer, media_type=media_type)

    W, R = wire, RUNNERS
    route("/store/enqueue", "POST", enqueue, "enqueue rollouts", W.EnqueueBody)
    route("/store/dequeue", "POST", dequeue, "claim the next rollout", W.DequeueBody, who=RUNNERS)
    route("/store/attempts/{attempt_id}", "GET", get_attempt, "an attempt", who=RUNNERS)
    route("/store/attempts/{attempt_id}/start", "POST", start_attempt, "mark an attempt running", who=RUNNERS)
    route("/store/attempts/{attempt_id}/heartbeat", "POST", heartbeat, "an attempt's heartbeat", who=RUNNERS)
    route("/store/attempts/{attempt_id}/finish", "POST", finish_attempt, "end an attempt", W.FinishAttemptBody, who=R)
    route("/store/rollouts/{rollout_id}/finish", "POST", finish_rollout, "end a rollout", W.FinishRolloutBody)
    route("/store/spans", "POST", add_spans, "add spans", W.SpansBody, idempotent=True, who=WRITERS)
    route("/store/rollouts", "GET", list_rollouts, "list rollouts", query=W.LIST_QUERY)
    route("/store/rollouts/query", "POST", query_rollouts, "list rollouts", W.QueryBody)
    route("/store/rollouts/{rollout_id}", "GET", get_rollout, "a rollout")
    route("/store/rollouts/{rollout_id}/attempts", "GET", list_attempts, "a rollout's attempts")
    route("/store/rollouts/{rollout_id}/spans", "GET", query_spans, "a rollout's spans", query=W.SPANS_QUERY, who=R)
    route("/store/wait", "POST", wait, "wait for rollouts to end", W.WaitBody)
    route("/store/bulk/rollouts", "POST", bulk_rollouts, "rollouts as dicts", W.BulkReadBody)
    route("/store/bulk/spans", "POST", bulk_spans, "spans as dicts", W.BulkReadBody)
    route("/store/bulk/columns", "POST", bulk_columns, "LLM spans as columns", W.BulkReadBody)
    route("/store/resources", "POST", add_resources, "publish resources", W.ResourcesBody, idempotent=True)
    route("/store/resources/latest", "GET", latest_resources, "the latest resources", who=RUNNERS)
    route("/store/resources/{version}", "GET", get_resources, "resources by version", who=RUNNERS)
    route("/store/counts", "GET", counts, "rollouts by status", who=RUNNERS)
    route("/store/reap", "POST", reap, "time out silent attempts", W.ReapBody, idempotent=True)
    route("/health", "GET", health, "health")
    route("/v1/traces", "POST", otlp_traces, "OTLP/HTTP trace export (protobuf or JSON)", W.OtlpTracesBody, who=WRITERS)
    for path, handler, summary, model in access.routes(body):  # runner credentials; keys checked for the proxy
        route(path, "POST", handler, summary, model)
    server.serve_openapi(operations)
    return server.app


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
