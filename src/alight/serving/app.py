"""`ServerApp`: the FastAPI app the store server and the LLM proxy start from.

What both need, written once: no docs pages and no OpenTelemetry spans for requests (the OpenAPI
document of the server's own routes at `/openapi.json`, see `serve_openapi`), the server's
lifespan, a capped request body, long work dropped when its client goes (`unless_disconnected`),
and every failure answered as JSON, never a traceback: an unknown route or method, an
`AlightError` (its status and code), a failed validation, a client gone, an unexpected exception
(logged, answered 500). The server names the error
format (`error_body`): the store answers `{"error": {"code", "message"}}`, the proxy OpenAI's
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypeVar

import fastapi
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from alight.errors import AlightError, InvalidRequestError, PayloadTooLargeError, UnauthorizedError, one_line
from alight.serving.auth import AUTHENTICATED, GRANT, BearerAuth, Resolve
from alight.serving.credentials import Grant

if TYPE_CHECKING:
    from alight.serving.openapi import Operation

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: How often a request waiting on long work checks that its client is still there (seconds).
DISCONNECT_POLL_S = 0.25

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
JSON = "application/json"

#: Writes an error as the server answers it: (status, code or None, one-line message) -> JSON body.
ErrorBody = Callable[[int, str | None, str], bytes]
Endpoint = Callable[[Request], Awaitable[Response]]
#: A route's handler: the answer, or the bytes of a JSON answer.
Handler = Callable[[Request], Awaitable[Response | bytes]]


class AnsweredError(Exception):
    """An error that carries its own HTTP answer (the proxy's OpenAI errors, with their `param`)."""

    status: int = 400

    def body(self) -> bytes:
        raise NotImplementedError


class ServerApp:
    """A FastAPI app (`.app`) whose routes answer every failure as JSON in `error_body`'s format.

    `lifespan` (optional) is entered while the app serves: the store's watchdog, the proxy's
    engine. `what` names the server in logs; `max_body_bytes` caps the bodies `body()` reads; with `token`,
    requests need `Authorization: Bearer <token>`, or a credential `resolve` knows (see
    `alight.serving.auth`)."""

    def __init__(
        self,
        what: str,
        *,
        error_body: ErrorBody,
        lifespan: Callable[[], AbstractAsyncContextManager[None]] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        token: str | None = None,
        error_body_for: Callable[[str], ErrorBody | None] | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        self.what = what
        self.error_body = error_body
        self.error_body_for = error_body_for
        self.max_body_bytes = max_body_bytes

        @contextlib.asynccontextmanager
        async def serving(app: fastapi.FastAPI) -> AsyncIterator[None]:
            async with lifespan() if lifespan is not None else contextlib.nullcontext():
                yield

        self.app = fastapi.FastAPI(
            title=f"alight {what}",
            lifespan=serving,
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
            # No OpenTelemetry spans for requests: the store would be fed its own traffic, the
            # proxy writes its own LLM spans, and they cost time on every request.
            telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        )
        self.app.add_exception_handler(HTTPException, self._on_http_exception)
        # Authentication (alight.serving.auth): with a token, every route but /health needs it.
        self.token = token
        if token is not None:

            def refuse(path: str, message: str) -> bytes:
                return self.error_body_at(path)(401, UnauthorizedError.code, one_line(message))

            self.app.add_middleware(BearerAuth, token=token, refuse=refuse, resolve=resolve)

    @staticmethod
    def authenticated(request: Request) -> bool:
        """True when the request's bearer token was checked (the server has a token)."""
        return bool(request.scope.get(AUTHENTICATED))

    @staticmethod
    def grant(request: Request) -> Grant | None:
        """What the request's credential may do (None on a server without a token)."""
        grant: Grant | None = request.scope.get(GRANT)
        return grant

    def error_body_at(self, path: str) -> ErrorBody:
        """The error format of `path`: `error_body_for`'s where it names one (the proxy's
        Anthropic routes), else the server's."""
        chosen = self.error_body_for(path) if self.error_body_for is not None else None
        return chosen or self.error_body

    def error(self, status: int, code: str | None, message: str, path: str = "") -> Response:
        """An error answer in the format of `path` (the message on one line)."""
        body = self.error_body_at(path)(status, code, one_line(message))
        return Response(body, status_code=status, media_type=JSON)

    def guard(self, handler: Handler) -> Endpoint:
        """`handler` as an endpoint that answers JSON bytes as JSON and every failure as an error."""

        async def endpoint(request: Request) -> Response:
            try:
                answer = await handler(request)
            except AnsweredError as err:
                return Response(err.body(), status_code=err.status, media_type=JSON)
            except AlightError as err:
                return self.error(err.http_status, err.code, str(err), request.url.path)
            except ValidationError as err:
                return self.error(422, InvalidRequestError.code, validation_message(err), request.url.path)
            except ClientDisconnect:
                message = "client disconnected before the answer"
                return self.error(400, InvalidRequestError.code, message, request.url.path)
            except Exception as err:
                logger.exception("%s: %s %s failed", self.what, request.method, request.url.path)
                return self.error(500, None, f"internal error: {one_line(err)}", request.url.path)
            return answer if isinstance(answer, Response) else Response(answer, media_type=JSON)

        return endpoint

    def route(self, path: str, method: str, handler: Handler) -> None:
        """Add `handler` at `path` for `method`, guarded (see `guard`)."""
        self.app.add_route(path, self.guard(handler), methods=[method])

    async def body(self, request: Request) -> bytes:
        """The request body, refused past `max_body_bytes` (see `read_body`)."""
        return await read_body(request, self.max_body_bytes)

    # -- the OpenAPI document (GET /openapi.json) ------------------------------------------------
    def serve_openapi(self, operations: Sequence[Operation]) -> None:
        """Serve an OpenAPI 3.1 document of `operations` at GET /openapi.json (built on first ask)."""
        from alight.serving.openapi import document

        cached: list[bytes] = []

        async def openapi(request: Request) -> Response:
            if not cached:  # the standard encoder: bounds such as 2**64 are past orjson's integers
                import json

                cached.append(json.dumps(document(self.app.title, operations)).encode())
            return Response(cached[0], media_type=JSON)

        self.app.add_route("/openapi.json", openapi, methods=["GET"])

    async def _on_http_exception(self, request: Request, exc: Exception) -> Response:
        # Unknown paths and methods answer in the same format as everything else.
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = "not_found" if status == 404 else None
        message = f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}"
        return self.error(status, code, message, request.url.path)


async def unless_disconnected(request: Request, work: Awaitable[_T]) -> _T:
    """`work`'s result, or ClientDisconnect once the client has gone (the work is cancelled then),
    so a hung-up client does not keep a long wait or a generation running."""
    task: asyncio.Future[_T] = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnect()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with PayloadTooLargeError past `limit` bytes (checked on the
    declared Content-Length first, then while streaming a chunked body)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequestError(f"bad Content-Length header {declared!r}") from None
        if size > limit:
            raise PayloadTooLargeError(f"request body of {size} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def validation_message(err: ValidationError) -> str:
    """The first problem of a failed validation, its location and how many more there are."""
    problems = err.errors(include_url=False, include_context=False, include_input=False)
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"])
    text = f"{where}: {first['msg']}" if where else first["msg"]
    more = len(problems) - 1
    return f"invalid request body: {text}" + (f" (and {more} more errors)" if more else "")
