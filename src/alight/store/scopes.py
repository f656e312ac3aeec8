"""What the store server lets a request do beyond its token: runner scopes and secret redaction.

A runner names itself in `X-Alight-Runner` (`alight.serving.auth.RUNNER_HEADER`); its writes into
an attempt (start, heartbeat, finish, spans) are refused with 403 when another runner claimed that
attempt. Requests without the header (the trainer, the proxy) are not runner-scoped. Resources read
back by a request that did not prove the token have their secrets (`LLMResource.api_key`) removed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeVar

from alight.errors import ForbiddenError, NotFoundError
from alight.store.base import Store
from alight.types import LLMResource, ResourceSet

_REMEMBERED_OWNERS = 65536
_Set = TypeVar("_Set", ResourceSet, ResourceSet | None)


class RunnerScopes:
    """Checks a runner's writes against the runner recorded on each attempt at claim time (which
    never changes afterwards, so owners are remembered: one store read per attempt)."""

    def __init__(self, store: Store, size: int = _REMEMBERED_OWNERS) -> None:
        self._store = store
        self._size = size
        self._owners: OrderedDict[str, str | None] = OrderedDict()

    async def owner(self, attempt_id: str) -> str | None:
        """The runner that claimed `attempt_id` (NotFoundError for an unknown attempt)."""
        if attempt_id in self._owners:
            return self._owners[attempt_id]
        owner = (await self._store.get_attempt(attempt_id)).worker_id
        self._owners[attempt_id] = owner
        if len(self._owners) > self._size:
            self._owners.popitem(last=False)
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
