"""What the runner supervisor says to and asks of the store: the end of an attempt its runner
could not record (killed, died, drained too late), and the rollouts by status."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import TYPE_CHECKING

from alight.errors import AlightError, InvalidTransitionError, NotFoundError
from alight.serving.auth import bearer_header
from alight.types import AttemptStatus

if TYPE_CHECKING:
    from alight.store.client import StoreClient

logger = logging.getLogger(__name__)

Ending = tuple[str, AttemptStatus, str]  # an attempt to record as ended: id, status, error


def store_counts(store_url: str, token: str | None) -> dict[str, int]:
    """Rollouts by status in the store server at `store_url` (a plain request: pools poll it from threads)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the store is reached directly
    request = urllib.request.Request(f"{store_url}/store/counts", headers=bearer_header(token))
    with opener.open(request, timeout=30) as answer:
        return {str(key): int(value) for key, value in json.loads(answer.read()).items()}


async def record_end(store: StoreClient, attempt_id: str, status: AttemptStatus, error: str) -> None:
    """Record in the store how an attempt a pool's runner held ended (the runner could not)."""
    try:
        await store.finish_attempt(attempt_id, status, error=error)
    except (InvalidTransitionError, NotFoundError) as err:
        logger.info("runner pool: attempt %s had already ended: %s", attempt_id, err)
    except AlightError as err:
        logger.warning("runner pool: could not record the end of attempt %s: %s", attempt_id, err)
