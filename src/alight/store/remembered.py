"""Answers the store server remembers by idempotency key, so that a retried write (the client
retries on a lost connection) is answered, not applied, a second time."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import Response

from alight.serving.app import Endpoint, ServerApp
from alight.store.wire import IDEMPOTENCY_HEADER

REMEMBERED_ANSWERS = 4096  # answers kept, newest first


class RememberedAnswers:
    """Answers of recent requests by idempotency key: a retried write gets the first answer
    (the same span counts, the same resource version) instead of being applied again, also while
    the first try still runs. Only in memory: resource and reap writes also hand the key to the
    store as their write id, which remembers it durably (a retry after a restart)."""

    def __init__(self, server: ServerApp, size: int = REMEMBERED_ANSWERS) -> None:
        self._server = server
        self._size = size
        self._answers: OrderedDict[str, asyncio.Future[Response]] = OrderedDict()

    def wrap(self, endpoint: Endpoint) -> Endpoint:
        async def remembered(request: Request) -> Response:
            key = request.headers.get(IDEMPOTENCY_HEADER)
            if key is None:
                return await endpoint(request)
            key = f"{request.url.path} {key}"  # a key reused on another route is not that route's retry
            known = self._answers.get(key)
            if known is not None:  # a retry, possibly while the first try still runs
                return await asyncio.shield(known)
            future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            self._answers[key] = future
            if len(self._answers) > self._size:
                self._answers.popitem(last=False)
            try:
                response = await endpoint(request)
            except BaseException:
                self._answers.pop(key, None)
                future.set_result(self._server.error(503, "retry", "the first try of this request was interrupted"))
                raise
            if response.status_code >= 500:
                self._answers.pop(key, None)  # let a later retry run again
            future.set_result(response)
            return response

        return remembered
