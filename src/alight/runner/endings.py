"""What the runner supervisor says to and asks of the store: its runner credential, the end of an
attempt its runner could not record (killed, died, drained too late), and the rollouts by status."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from alight.errors import AlightError, ConfigError, InvalidTransitionError, NotFoundError
from alight.serving.auth import bearer_header
from alight.serving.credentials import runner_name_of
from alight.types import AttemptStatus

if TYPE_CHECKING:
    from alight.store.client import StoreClient

logger = logging.getLogger(__name__)

Ending = tuple[str, AttemptStatus, str]  # an attempt to record as ended: id, status, error


def runner_credential(store_url: str, token: str | None, name: str) -> tuple[str | None, str | None]:
    """(the credential a pool's runners use, the runner name it carries) for a pool holding `token`:
    a runner credential is used as it is; with the admin token, the store mints one for `name`
    (ConfigError when it refuses). (None, None) without a token, or when the store has none."""
    if token is None:
        return None, None
    own = runner_name_of(token)
    if own is not None:
        return token, own
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{store_url}/store/runners",
        data=json.dumps({"name": name}).encode(),
        headers={"content-type": "application/json", **bearer_header(token)},
    )
    try:
        with opener.open(request, timeout=30) as answer:
            return str(json.loads(answer.read())["credential"]), name
    except urllib.error.HTTPError as err:
        if err.code == 403:  # a store server without a token: runners need no credential
            return None, None
        raise ConfigError(f"the store at {store_url} refused to register runner {name!r} (HTTP {err.code})") from None
    except OSError as err:
        raise ConfigError(f"cannot reach the store at {store_url} to register runner {name!r}: {err}") from None


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
