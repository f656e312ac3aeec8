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


class ConfigError(AlightError):
    """A configuration, path or command-line argument is wrong."""

    code = "config_error"


class StoreError(AlightError):
    """The store refused an operation."""

    http_status = 500
    code = "store_error"


class InvalidRequestError(StoreError):
    """The request is malformed: bad JSON, a missing field, a value of the wrong type."""

    http_status = 422
    code = "invalid_request"


class NotFoundError(StoreError):
    """An id (rollout, attempt, resource version) that the store does not know."""

    http_status = 404
    code = "not_found"


class InvalidTransitionError(StoreError):
    """A status change that the rollout/attempt life cycle does not allow."""

    http_status = 409
    code = "invalid_transition"


class PayloadTooLargeError(StoreError):
    """A request body above the server's size limit."""

    http_status = 413
    code = "payload_too_large"


class StoreUnavailableError(StoreError):
    """The store server could not be reached, even after retries."""

    http_status = 503
    code = "store_unavailable"


class ContextLengthError(InvalidRequestError):
    """A prompt (plus the requested answer) does not fit the model's context."""

    code = "context_length_exceeded"


class EngineUnavailableError(AlightError):
    """The inference backend could not answer: a remote endpoint is down, timed out or failed."""

    http_status = 502
    code = "engine_unavailable"


class TrainingError(AlightError):
    """A training run cannot go on (too few rollouts ended in time, every rollout failed); the CLI
    exits with code 1, as for any failure that is not the user's input."""

    http_status = 500
    code = "training_failed"


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
    )
}
