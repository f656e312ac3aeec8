"""Proxy headers on raw HTTP requests: `httpx`, `requests`, `aiohttp` and `urllib.request`.

An agent that POSTs `{llm.base_url}/chat/completions` itself, with no SDK, still gets its LLM calls
placed under its agent: inside an attempt, every request these clients send to an alight proxy
route (a URL path matching `PROXY_PATH`, or a request naming its attempt in the rollout/attempt id
headers) gets the same headers the openai SDK instrumentation adds: agent name, parent span, trace
id and the call's sequence number. Each library is patched once, at the point every request of it
passes through:

- httpx: `Client.send` / `AsyncClient.send` (the SDKs built on httpx, openai and anthropic, too);
- requests: `Session.send` (`requests.get/post` go through a session);
- aiohttp: `ClientSession._request` (what `get/post/request` run; no trace config needed);
- urllib: `AbstractHTTPHandler.do_open` (`urlopen` and every opener with the HTTP(S) handlers).

A request that already carries `HEADER_SEQUENCE_ID` (numbered by an SDK's own instrumentation, or
by the agent) is left alone, so a call takes one sequence number; redirects of a call carry it
already. Headers the caller set itself (say its own `x-alight-agent`) win. Outside an attempt a
request costs one context-variable lookup. An error in the hook is logged and the request goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from alight import semconv
from alight.tracing.context import _Frame, current_frame
from alight.tracing.openai_sdk import PROXY_PATH

logger = logging.getLogger(__name__)

_ID_HEADERS = (semconv.HEADER_ROLLOUT_ID, semconv.HEADER_ATTEMPT_ID)
_installed: set[str] = set()
_warned: set[str] = set()


def proxy_headers(frame: _Frame, url: str, has_header: Callable[[str], bool]) -> dict[str, str] | None:
    """The headers to add to a request for `url` made under `frame`; None when it needs none (not
    an alight proxy route, or numbered already). `has_header` answers for a lower-case name."""
    if PROXY_PATH.search(url) is None and not any(has_header(name) for name in _ID_HEADERS):
        return None
    if has_header(semconv.HEADER_SEQUENCE_ID):
        return None
    added = {semconv.HEADER_SEQUENCE_ID: str(frame.attempt.next_sequence_id())}
    if not has_header(semconv.HEADER_AGENT_NAME):
        added[semconv.HEADER_AGENT_NAME] = frame.agent_name
    parent = frame.parent
    if parent is not None:
        if not has_header(semconv.HEADER_PARENT_SPAN_ID):
            added[semconv.HEADER_PARENT_SPAN_ID] = parent.span_id
        if not has_header(semconv.HEADER_TRACE_ID):
            added[semconv.HEADER_TRACE_ID] = parent.trace_id
    return added


def _guarded(library: str, add: Callable[..., None], *args: Any) -> None:
    """Run a header hook; a failure is logged (with its trace the first time) and swallowed."""
    try:
        add(*args)
    except Exception:  # the agent's request matters more than its span's place
        first = library not in _warned
        _warned.add(library)
        logger.warning(
            "alight could not add its proxy headers to a %s request; it goes on without them", library, exc_info=first
        )


# -- httpx ------------------------------------------------------------------------------------------


def _add_httpx(frame: _Frame, request: Any) -> None:
    headers = request.headers  # httpx.Headers: case-insensitive
    added = proxy_headers(frame, request.url.path, headers.__contains__)
    if added:
        headers.update(added)


def instrument_httpx() -> bool:
    """Patch `httpx.Client.send` and `httpx.AsyncClient.send`; False when httpx is not installed."""
    if "httpx" in _installed:
        return True
    try:
        import httpx
    except ImportError:
        return False
    sync_send = httpx.Client.send
    async_send = httpx.AsyncClient.send

    @functools.wraps(sync_send)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _guarded("httpx", _add_httpx, frame, request)
        return sync_send(self, request, *args, **kwargs)

    @functools.wraps(async_send)
    async def asend(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _guarded("httpx", _add_httpx, frame, request)
        return await async_send(self, request, *args, **kwargs)

    httpx.Client.send = send  # type: ignore[method-assign]
    httpx.AsyncClient.send = asend  # type: ignore[method-assign]
    _installed.add("httpx")
    return True


# -- requests ---------------------------------------------------------------------------------------


def _add_requests(frame: _Frame, request: Any) -> None:
    headers = request.headers  # CaseInsensitiveDict
    added = proxy_headers(frame, request.url or "", headers.__contains__)
    if added:
        headers.update(added)


def instrument_requests() -> bool:
    """Patch `requests.Session.send`; False when requests is not installed."""
    if "requests" in _installed:
        return True
    try:
        import requests
    except ImportError:
        return False
    original = requests.Session.send

    @functools.wraps(original)
    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _guarded("requests", _add_requests, frame, request)
        return original(self, request, **kwargs)

    requests.Session.send = send  # type: ignore[method-assign]
    _installed.add("requests")
    return True


# -- aiohttp ----------------------------------------------------------------------------------------


def _header_names(headers: Any) -> set[str]:
    """Lower-case names of aiohttp request headers: a mapping, a multidict or (name, value) pairs."""
    if not headers:
        return set()
    keys: Iterable[Any] = headers.keys() if isinstance(headers, Mapping) else (pair[0] for pair in headers)
    return {str(key).lower() for key in keys}


def _add_aiohttp(frame: _Frame, session: Any, str_or_url: Any, kwargs: dict[str, Any]) -> None:
    build_url = getattr(session, "_build_url", None)  # joins the session's base_url (aiohttp >= 3.8)
    url = build_url(str_or_url) if build_url is not None else str_or_url
    headers = kwargs.get("headers")
    names = _header_names(headers) | _header_names(getattr(session, "_default_headers", None))
    added = proxy_headers(frame, str(url), names.__contains__)
    if not added:
        return
    from multidict import CIMultiDict  # aiohttp's own dependency

    merged: CIMultiDict[str] = CIMultiDict(headers or ())
    merged.extend(added)
    kwargs["headers"] = merged


def instrument_aiohttp() -> bool:
    """Patch `aiohttp.ClientSession._request`; False when aiohttp is not installed."""
    if "aiohttp" in _installed:
        return True
    try:
        import aiohttp
    except ImportError:
        return False
    original = aiohttp.ClientSession._request

    @functools.wraps(original)
    async def request(self: Any, method: str, str_or_url: Any, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _guarded("aiohttp", _add_aiohttp, frame, self, str_or_url, kwargs)
        return await original(self, method, str_or_url, *args, **kwargs)

    aiohttp.ClientSession._request = request  # type: ignore[method-assign]
    _installed.add("aiohttp")
    return True


# -- urllib.request ---------------------------------------------------------------------------------


def _add_urllib(frame: _Frame, request: Any) -> None:
    names = {name.lower() for name, _ in request.header_items()}  # stored as "X-alight-agent"
    added = proxy_headers(frame, request.full_url, names.__contains__)
    for name, value in (added or {}).items():
        request.add_header(name, value)  # not unredirected: a redirect keeps the call's number


def instrument_urllib() -> bool:
    """Patch `urllib.request.AbstractHTTPHandler.do_open` (http and https)."""
    if "urllib" in _installed:
        return True
    import urllib.request

    original = urllib.request.AbstractHTTPHandler.do_open

    @functools.wraps(original)
    def do_open(self: Any, http_class: Any, request: Any, **http_conn_args: Any) -> Any:
        frame = current_frame()
        if frame is not None:
            _guarded("urllib", _add_urllib, frame, request)
        return original(self, http_class, request, **http_conn_args)

    urllib.request.AbstractHTTPHandler.do_open = do_open  # type: ignore[method-assign,assignment]
    _installed.add("urllib")
    return True
