"""The proxy's routes: OpenAI's API at `/v1/...`, `/rollout/{rollout_id}/attempt/{attempt_id}/v1/...`
and `.../attempt/{attempt_id}/agent/{agent_name}/trace/{trace_id}/span/{parent_span_id}/v1/...`, and
Anthropic's Messages API (`/v1/messages`) under the same prefixes.

On the app every alight server starts from (`alight.serving.app.ServerApp`), every failure answers
in OpenAI's error format (`{"error": {"message", "type", "param", "code"}}`): 400 for an invalid
request, 404 for an unknown model or route, 500 when the engine fails. The Anthropic routes answer
in Anthropic's (`{"type": "error", "error": {"type", "message"}}`, see `anthropic_api`).

Each handler takes what the routes share (`ProxyApp`: the proxy and its app) and the request; the
tables (`API_ROUTES` under each of `PREFIXES`, `ROUTES`, `ADMIN_ROUTES`) name their paths, and
`create_app` binds a `ProxyApp` and registers them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import fastapi
import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from alight.engines.base import ChatRequest, CompletionRequest, Generation
from alight.errors import AlightError, ForbiddenError
from alight.proxy import anthropic_api, anthropic_request
from alight.proxy import completion_objects as objects
from alight.proxy.protocol import (
    ChatBody,
    CompletionBody,
    ProxyError,
    openai_error_body,
    parse_json,
    validation_error,
)
from alight.proxy.proxy import Proxy, engine_error
from alight.proxy.recorder import CallContext, llm_span
from alight.proxy.responses_api import (
    ResponsesBody,
    ResponsesStream,
    output_items,
    response_object,
    status_of,
)
from alight.proxy.streaming import ChatStream, EngineStream, EventStream
from alight.serving.app import DEFAULT_MAX_BODY_BYTES, JSON, ErrorBody, Handler, ServerApp, unless_disconnected
from alight.serving.auth import Resolve
from alight.serving.openapi import Operation

logger = logging.getLogger(__name__)

ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
#: The route of one agent of an attempt, for programs that send no alight headers (command agents):
#: the path names the agent and the span its calls nest under (see CallContext.of).
AGENT_PREFIX = ROLLOUT_PREFIX + "/agent/{agent_name}/trace/{trace_id}/span/{parent_span_id}"
_Body = TypeVar("_Body", ChatBody, CompletionBody, ResponsesBody)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


class WeightsBody(BaseModel):
    """POST /admin/weights: a checkpoint directory to serve as `version`."""

    checkpoint: str
    version: int


@dataclass(frozen=True)
class ProxyApp:
    """What the proxy's handlers share: the proxy and the app that serves it."""

    proxy: Proxy
    server: ServerApp


#: A route's handler: the answer to `request`, served from `app`.
ProxyHandler = Callable[[ProxyApp, Request], Awaitable[Response | bytes]]


async def _parsed(app: ProxyApp, request: Request, model: type[_Body], context: CallContext) -> _Body:
    """The request's body as `model`, for a served model, with the sampling defaults of its rollout."""
    data = parse_json(await app.server.body(request))
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        raise validation_error(err) from None
    app.proxy.check_model(body.model)
    for key, value in app.proxy.sampling_for(context.rollout_id).items():
        if getattr(body, key) is None and not (key == "max_tokens" and getattr(body, "max_completion_tokens", None)):
            setattr(body, key, value)
    return body


async def _generate(
    app: ProxyApp,
    http: Request,
    context: CallContext,
    request: ChatRequest | CompletionRequest,
    run: Callable[[], Awaitable[Generation]],
    api: str | None = None,
) -> tuple[Generation, int | None, float, float]:
    """Run one call through the gate; an engine failure is recorded and answered as an error.
    A client that hangs up cancels the call (the engine stops generating for it)."""
    version = await app.proxy.gate.enter()
    started, clock = time.time(), time.perf_counter()
    try:
        generation = await unless_disconnected(http, run())
    except ClientDisconnect:
        logger.info("proxy: the client hung up; its call was cancelled")
        raise
    except Exception as err:
        failure = engine_error(err)
        if context.recorded:
            latency = time.perf_counter() - clock
            app.proxy.recorder.record(
                llm_span(
                    context, request, stream=False, started=started, latency_s=latency, version=version,
                    generation=None, error=str(failure), api=api,
                )
            )  # fmt: skip
        if failure.status >= 500:
            logger.error("proxy: %s", failure)
        raise failure from None
    finally:
        app.proxy.gate.leave()
    return generation, version, started, time.perf_counter() - clock


async def _answer_chat(
    app: ProxyApp, request: Request, context: CallContext, engine_request: ChatRequest, api: str
) -> tuple[Generation, dict[str, Any], int | None]:
    """An unstreamed chat call, recorded: the generation, the answered message, the version."""
    generation, version, started, latency = await _generate(
        app, request, context, engine_request, lambda: app.proxy.engine.chat(engine_request), api
    )
    message = objects.assistant_message(generation.message)
    if context.recorded:
        span = llm_span(
            context, engine_request, stream=False, started=started, latency_s=latency, version=version,
            generation=generation, message=message, api=api,
        )  # fmt: skip
        app.proxy.recorder.record(span)
    else:
        logger.debug("proxy: %s call without rollout/attempt ids: served, not recorded", api)
    return generation, message, version


async def chat(app: ProxyApp, request: Request) -> Response:
    context = CallContext.of(request.path_params, request.headers)
    body = await _parsed(app, request, ChatBody, context)
    engine_request = body.to_request()
    engine_request.agent = context.agent_name
    if body.stream:
        return await _streamed(ChatStream(app.proxy, context, engine_request, body))
    generation, message, version = await _answer_chat(app, request, context, engine_request, "chat")
    logprobs = objects.logprobs_content(generation, app.proxy.token_texts) if body.logprobs else None
    alight = objects.extension(generation, version, context.recorded_span_id) if body.return_token_ids else None
    call_id = objects.new_call_id("chatcmpl")
    return _json(objects.chat_completion(call_id, generation, message, logprobs=logprobs, alight=alight))


async def respond(app: ProxyApp, request: Request) -> Response:
    context = CallContext.of(request.path_params, request.headers)
    body = await _parsed(app, request, ResponsesBody, context)
    engine_request = body.to_request()
    engine_request.agent = context.agent_name
    if body.stream:
        return await _streamed(ResponsesStream(app.proxy, context, engine_request, body))
    created_at = time.time()
    generation, message, version = await _answer_chat(app, request, context, engine_request, "responses")
    alight = objects.extension(generation, version, context.recorded_span_id) if body.return_token_ids else None
    output = output_items(message, message_id=objects.new_call_id("msg"), status=status_of(generation))
    response_id = objects.new_call_id("resp")
    return _json(response_object(response_id, body, created_at, output=output, generation=generation, alight=alight))


async def messages(app: ProxyApp, request: Request) -> Response:
    try:
        context = CallContext.of(request.path_params, request.headers)
        body = anthropic_request.parse_body(parse_json(await app.server.body(request)))
        app.proxy.check_model(body.model)
        for key, value in app.proxy.sampling_for(context.rollout_id).items():
            if getattr(body, key) is None:
                setattr(body, key, value)
        engine_request = body.to_request()
        engine_request.agent = context.agent_name
        if body.stream:
            return await _streamed(anthropic_api.MessagesStream(app.proxy, context, engine_request, body))
        generation, message, version = await _answer_chat(app, request, context, engine_request, anthropic_api.API)
    except (ProxyError, AlightError) as err:
        raise anthropic_api.as_anthropic(err) from None
    stop = anthropic_api.stop_of(generation, engine_request.sampling.stop, app.proxy.token_texts)
    alight = objects.extension(generation, version, context.recorded_span_id) if body.return_token_ids else None
    content = anthropic_api.content_blocks(message)
    answer = anthropic_api.message_object(
        anthropic_api.new_message_id(), body.model, content, generation=generation, stop=stop, alight=alight
    )
    return _json(answer)


async def doubled_v1(app: ProxyApp, request: Request) -> Response:
    raise anthropic_api.AnthropicError(
        f"POST {request.url.path}: not found. The base URL ends in /v1, which Anthropic clients add "
        "themselves: pass the attempt's route without it (`llm.anthropic_base_url`).",
        status=404,
    )


async def complete(app: ProxyApp, request: Request) -> Response:
    context = CallContext.of(request.path_params, request.headers)
    body = await _parsed(app, request, CompletionBody, context)
    engine_request = body.to_request()
    engine_request.agent = context.agent_name
    generation, version, started, latency = await _generate(
        app, request, context, engine_request, lambda: app.proxy.engine.complete(engine_request)
    )
    if context.recorded:
        span = llm_span(
            context, engine_request, stream=body.stream, started=started, latency_s=latency, version=version,
            generation=generation,
        )  # fmt: skip
        app.proxy.recorder.record(span)
    else:
        logger.debug("proxy: completions call without rollout/attempt ids: served, not recorded")
    alight = objects.extension(generation, version, context.recorded_span_id) if body.return_token_ids else None
    call_id = objects.new_call_id("cmpl")
    if body.stream:
        return EventStream(objects.completion_events(call_id, generation, body.include_usage), None)
    answer = objects.completion(
        call_id, generation, logprobs=body.logprobs, token_texts=app.proxy.token_texts, alight=alight
    )
    return _json(answer)


async def models(app: ProxyApp, request: Request) -> Response:
    names = app.proxy.model_names
    # OpenAI's list, with the fields Anthropic's adds (has_more, first_id, last_id): both SDKs read it.
    cards = [objects.model_card(name) for name in names]
    return _json({"object": "list", "data": cards, "has_more": False, "first_id": names[0], "last_id": names[-1]})


async def model(app: ProxyApp, request: Request) -> Response:
    name = request.path_params["model"]
    app.proxy.check_model(name)
    return _json(objects.model_card(name))


async def health(app: ProxyApp, request: Request) -> Response:
    return _json({"status": "ok", "version": app.proxy.version, "in_flight": app.proxy.gate.in_flight})


async def update_weights(app: ProxyApp, request: Request) -> Response:
    try:
        body = WeightsBody.model_validate(parse_json(await app.server.body(request)))
    except ValidationError as err:
        raise validation_error(err) from None
    try:
        await app.proxy.update_weights(body.checkpoint, body.version)
    except AlightError as err:
        raise ProxyError(str(err), code=err.code) from None
    except NotImplementedError as err:
        raise ProxyError(str(err), code="unsupported") from None
    return _json({"version": app.proxy.version})


# -- the table ------------------------------------------------------------------------------------
class ProxyRoute(NamedTuple):
    """One route of the proxy: where, what it runs, and how OpenAPI describes it."""

    path: str
    method: str
    handler: ProxyHandler
    summary: str
    body: type[BaseModel] | None = None
    # False: a common mistake, answered by name: open to any credential, not in the OpenAPI document
    documented: bool = True


#: The prefixes `API_ROUTES` are served under: plain, an attempt's, an attempt's agent's.
PREFIXES = ("", ROLLOUT_PREFIX, AGENT_PREFIX)
#: The OpenAI and Anthropic API, under each of `PREFIXES` (own_attempt_only: see `create_app`).
API_ROUTES: tuple[ProxyRoute, ...] = (
    ProxyRoute("/v1/chat/completions", "POST", chat, "chat completion", ChatBody),
    ProxyRoute("/v1/completions", "POST", complete, "text completion", CompletionBody),
    ProxyRoute("/v1/responses", "POST", respond, "Responses API call", ResponsesBody),
    ProxyRoute("/v1/messages", "POST", messages, "Anthropic Messages API call", anthropic_request.MessagesBody),
    ProxyRoute("/v1/v1/messages", "POST", doubled_v1, "a base URL's /v1 doubled", documented=False),
    ProxyRoute("/v1/models", "GET", models, "served models"),
    ProxyRoute("/v1/models/{model:path}", "GET", model, "a served model"),
)
ROUTES: tuple[ProxyRoute, ...] = (ProxyRoute("/health", "GET", health, "health"),)
#: With `admin`: for trainers in other processes.
ADMIN_ROUTES: tuple[ProxyRoute, ...] = (
    ProxyRoute("/admin/weights", "POST", update_weights, "serve new weights", WeightsBody),
)


def create_app(
    proxy: Proxy,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    admin: bool = False,
    token: str | None = None,
    resolve: Resolve | None = None,
) -> fastapi.FastAPI:
    """The proxy's app. Its lifespan starts the proxy (engine) and closes it (spans flushed,
    engine and store closed). `admin` adds POST /admin/weights for trainers in other processes.
    With `token`, every route but /health needs it as the bearer (the OpenAI client's `api_key`),
    or an agent key `resolve` knows (the store's), which opens only its own attempt's routes."""
    server = ServerApp(
        "proxy",
        error_body=openai_error_body,
        lifespan=functools.partial(_running, proxy),
        max_body_bytes=max_body_bytes,
        token=token,
        error_body_for=_error_body_for,
        resolve=resolve,
    )
    app = ProxyApp(proxy, server)
    operations: list[Operation] = []
    api_routes = [route._replace(path=prefix + route.path) for prefix in PREFIXES for route in API_ROUTES]
    for route in (*api_routes, *ROUTES, *(ADMIN_ROUTES if admin else ())):
        handler = functools.partial(route.handler, app)
        if route.documented:
            server.route(route.path, route.method, own_attempt_only(handler))
            operations.append(Operation(route.path, route.method, route.summary, route.body))
        else:
            server.route(route.path, route.method, handler)
    server.serve_openapi(operations)
    return server.app


@contextlib.asynccontextmanager
async def _running(proxy: Proxy) -> AsyncIterator[None]:
    # The app's lifespan: the proxy (its engine) runs while the app serves.
    if not proxy.started:  # ProxyServer starts it before serving, to report failures in one line
        await proxy.start()
    try:
        yield
    finally:
        await proxy.close()


async def _streamed(stream: EngineStream) -> Response:
    """The call's event stream, once the engine has answered its first piece (errors before that
    are plain HTTP errors)."""
    await stream.open()
    return EventStream(stream.events(), stream.close)


def own_attempt_only(handler: Handler) -> Handler:
    """`handler`, refused (403) to a credential other than the token unless it is the agent key
    of the attempt the path names."""

    async def checked(request: Request) -> Response | bytes:
        grant = ServerApp.grant(request)
        if grant is not None and grant.kind != "admin":
            params = request.path_params
            if grant.kind != "agent" or (params.get("rollout_id"), params.get("attempt_id")) != (
                grant.rollout_id,
                grant.attempt_id,
            ):
                raise ForbiddenError(f"this key opens only its own attempt's routes, not {request.url.path}")
        return await handler(request)

    return checked


def _error_body_for(path: str) -> ErrorBody | None:
    """Anthropic's error format on the Anthropic routes (the path's tail is `/v1/messages...`)."""
    return anthropic_api.anthropic_error_body if "/v1/messages" in path else None
