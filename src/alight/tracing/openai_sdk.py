"""Instrumentation of the `openai` SDK: proxy headers on every request, LLM spans for the rest.

`instrument_openai()` patches the SDK once per process, at two levels; neither does anything
outside an attempt.

- Every request an openai client sends (`SyncAPIClient.request` / `AsyncAPIClient.request`: one
  call per API call, retries included) to an alight proxy route gets the headers that place the
  proxy's LLM span in the attempt: agent name, parent span, trace id and the call's sequence
  number. That covers every method: `chat.completions.create`/`parse`/`stream`, the raw and
  streaming-response variants, legacy `completions.create`, `responses.create`, ...
- `chat.completions.create`/`parse` and legacy `completions.create` (sync and async; the `stream()`
  helpers and the `with_raw_response`/`with_streaming_response` variants go through them) are
  followed by an `LLMCall`: for an endpoint that is not an alight proxy it records the LLM span
  (`llm.source="client"`), and for any endpoint it infers TOOL spans from the tool calls a later
  request answers (for plain-Python agents that run tools without telling alight).

A call takes one sequence number: the LLM span's for a recorded call, the header's for a proxied
one (a request that already carries `HEADER_SEQUENCE_ID` keeps it).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from alight import semconv
from alight.tracing.context import _Frame, current_frame

logger = logging.getLogger(__name__)

#: The path of an alight proxy route bound to one attempt.
PROXY_PATH = re.compile(r"/rollout/[^/]+/attempt/[^/]+/v1")
_ID_HEADERS = frozenset({semconv.HEADER_ROLLOUT_ID, semconv.HEADER_ATTEMPT_ID})
_installed = False


def instrument_openai() -> bool:
    """Patch the openai SDK (see the module doc); False when openai is not installed."""
    global _installed
    if _installed:
        return True
    try:
        from openai import _base_client
        from openai.resources import completions as text
        from openai.resources.chat.completions import completions as chat
    except ImportError:
        return False
    _base_client.SyncAPIClient.request = _sync_request(_base_client.SyncAPIClient.request)  # type: ignore[method-assign]
    _base_client.AsyncAPIClient.request = _async_request(_base_client.AsyncAPIClient.request)  # type: ignore[method-assign]
    for resource, method, is_chat in (
        (chat.Completions, "create", True),
        (chat.Completions, "parse", True),
        (text.Completions, "create", False),
    ):
        setattr(resource, method, _sync_call(getattr(resource, method), is_chat))
    for aresource, method, is_chat in (
        (chat.AsyncCompletions, "create", True),
        (chat.AsyncCompletions, "parse", True),
        (text.AsyncCompletions, "create", False),
    ):
        setattr(aresource, method, _async_call(getattr(aresource, method), is_chat))
    _installed = True
    return True


# -- every request: proxy headers -----------------------------------------------------------------


def is_proxy_call(client: Any, headers: Mapping[str, Any] | None, url: str = "") -> bool:
    """True when `client` sends this request (its extra `headers`, its `url` when absolute) to an
    alight proxy route, which records the call itself."""
    base_url = client._base_url
    route = client.__dict__.get("_alight_route")  # str(URL) and the regex cost microseconds: once per base URL
    if route is None or route[0] is not base_url:
        route = (base_url, PROXY_PATH.search(str(base_url)) is not None)
        client.__dict__["_alight_route"] = route
    if route[1]:
        return True
    if url[:4] == "http" and PROXY_PATH.search(url):
        return True
    return _names_attempt(client._custom_headers) or _names_attempt(headers)


def _names_attempt(headers: Mapping[str, Any] | None) -> bool:
    return bool(headers) and any(type(key) is str and key.lower() in _ID_HEADERS for key in headers)  # type: ignore[union-attr]


def _add_proxy_headers(frame: _Frame, client: Any, options: Any) -> None:
    """Give a proxy-bound request (`FinalRequestOptions`, made for this call) the attempt's headers."""
    headers = options.headers or None  # NotGiven when the caller passed none
    if not is_proxy_call(client, headers, options.url):
        return
    added = {semconv.HEADER_AGENT_NAME: frame.agent_name}
    if not headers or not any(type(key) is str and key.lower() == semconv.HEADER_SEQUENCE_ID for key in headers):
        added[semconv.HEADER_SEQUENCE_ID] = str(frame.attempt.next_sequence_id())  # else numbered already
    parent = frame.parent
    if parent is not None:
        added[semconv.HEADER_PARENT_SPAN_ID] = parent.span_id
        added[semconv.HEADER_TRACE_ID] = parent.trace_id
    options.headers = {**added, **headers} if headers else added  # the caller's own values win


def _options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("options")


def _sync_request(request: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(request)
    def traced_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _add_proxy_headers(frame, self, _options(args, kwargs))
        return request(self, *args, **kwargs)

    return traced_request


def _async_request(request: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(request)
    async def traced_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _add_proxy_headers(frame, self, _options(args, kwargs))
        return await request(self, *args, **kwargs)

    return traced_request


# -- completion methods: LLM spans for endpoints that are not a proxy -------------------------------


def _sync_call(method: Callable[..., Any], chat: bool) -> Callable[..., Any]:
    from alight.tracing.openai_calls import LLMCall

    @functools.wraps(method)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return method(self, *args, **kwargs)
        proxied = is_proxy_call(self._client, kwargs.get("extra_headers"))
        call = LLMCall(frame, kwargs, chat=chat, proxied=proxied)
        try:
            result = method(self, *args, **call.kwargs)
        except BaseException as err:
            call.fail(err)
            raise
        return call.received(result)

    return traced


def _async_call(method: Callable[..., Any], chat: bool) -> Callable[..., Any]:
    from alight.tracing.openai_calls import LLMCall

    @functools.wraps(method)
    async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None:
            return await method(self, *args, **kwargs)
        proxied = is_proxy_call(self._client, kwargs.get("extra_headers"))
        call = LLMCall(frame, kwargs, chat=chat, proxied=proxied)
        try:
            result = await method(self, *args, **call.kwargs)
        except BaseException as err:
            call.fail(err)
            raise
        return call.received(result)

    return traced
