"""The one exception hierarchy of alight.

Every error a user can cause is an `AlightError` with a one-line message; the CLI prints the
message and exits with code 2. The HTTP store maps each class to a status code and back, so a
caller sees the same exception whichever store implementation it talks to.
"""

from __future__ import annotations


class AlightError(Exception):
    """Base class of every error alight raises on purpose; `str(err)` is one line for the user."""

    #: HTTP status the store server answers with for this error.
    http_status: int = 400
    #: Short machine-readable name carried in HTTP error bodies.
    code: str = "alight_error"

    def __init_subclass__(cls, *, code: str | None = None, http_status: int | None = None, **kwargs: object) -> None:
        # `class NotFoundError(StoreError, code="not_found", http_status=404)`: both in the class line.
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if http_status is not None:
            cls.http_status = http_status


class ConfigError(AlightError, code="config_error"):
    """A configuration, path or command-line argument is wrong."""


class StoreError(AlightError, code="store_error", http_status=500):
    """The store refused an operation."""


class InvalidRequestError(StoreError, code="invalid_request", http_status=422):
    """The request is malformed: bad JSON, a missing field, a value of the wrong type."""


class NotFoundError(StoreError, code="not_found", http_status=404):
    """An id (rollout, attempt, resource version) that the store does not know."""


class InvalidTransitionError(StoreError, code="invalid_transition", http_status=409):
    """A status change that the rollout/attempt life cycle does not allow."""


class PayloadTooLargeError(StoreError, code="payload_too_large", http_status=413):
    """A request body above the server's size limit."""


class StoreUnavailableError(StoreError, code="store_unavailable", http_status=503):
    """The store server could not be reached, even after retries."""


class ContextLengthError(InvalidRequestError, code="context_length_exceeded"):
    """A prompt (plus the requested answer) does not fit the model's context."""


class EngineUnavailableError(AlightError, code="engine_unavailable", http_status=502):
    """The inference backend could not answer: a remote endpoint is down, timed out or failed."""


class UnauthorizedError(AlightError, code="unauthorized", http_status=401):
    """A server that requires a token got none or a wrong one (`--token` / `ALIGHT_TOKEN`)."""


class ForbiddenError(AlightError, code="forbidden", http_status=403):
    """A runner wrote into an attempt another runner claimed."""


class TrainingError(AlightError, code="training_failed", http_status=500):
    """A training run cannot go on (too few rollouts ended in time, every rollout failed); the CLI
    exits with code 1, as for any failure that is not the user's input."""


def one_line(error: BaseException | str, limit: int = 1000) -> str:
    """An exception as `Type: message` (`Type` alone when it says nothing), or a text, on one line:
    whitespace runs collapsed, cut to `limit` characters (ending in "...")."""
    if isinstance(error, BaseException):
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message.strip() else type(error).__name__
    else:
        text = error
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


#: Error classes by their `code`, for the HTTP client to raise what the server raised.
ERRORS_BY_CODE: dict[str, type[AlightError]] = {
    cls.code: cls
    for cls in (
        AlightError,
        ConfigError,
        StoreError,
        InvalidRequestError,
        ContextLengthError,
        NotFoundError,
        InvalidTransitionError,
        PayloadTooLargeError,
        StoreUnavailableError,
        EngineUnavailableError,
        UnauthorizedError,
        ForbiddenError,
    )
}
