"""The store's wire protocol, shared by the HTTP server and client: request bodies, the JSON
adapters of every answer, the error body, and the idempotency header."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from alight.errors import (
    ERRORS_BY_CODE,
    AlightError,
    ForbiddenError,
    InvalidRequestError,
    InvalidTransitionError,
    NotFoundError,
    PayloadTooLargeError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
    one_line,
)
from alight.types import (
    Attempt,
    AttemptStatus,
    Claim,
    Resource,
    ResourceSet,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    StoreInt,
)

#: Header naming a write whose answer the server remembers, so a retried write is not applied twice.
IDEMPOTENCY_HEADER = "idempotency-key"

ROLLOUT: TypeAdapter[Rollout] = TypeAdapter(Rollout)
ROLLOUTS: TypeAdapter[list[Rollout]] = TypeAdapter(list[Rollout])
ATTEMPT: TypeAdapter[Attempt] = TypeAdapter(Attempt)
ATTEMPTS: TypeAdapter[list[Attempt]] = TypeAdapter(list[Attempt])
MAYBE_CLAIM: TypeAdapter[Claim | None] = TypeAdapter(Claim | None)
SPANS: TypeAdapter[list[Span]] = TypeAdapter(list[Span])
RESOURCES: TypeAdapter[dict[str, Resource]] = TypeAdapter(dict[str, Resource])
RESOURCE_SET: TypeAdapter[ResourceSet] = TypeAdapter(ResourceSet)
MAYBE_RESOURCE_SET: TypeAdapter[ResourceSet | None] = TypeAdapter(ResourceSet | None)

# -- request bodies ---------------------------------------------------------------------------


#: The longest a `/store/wait` request is held (seconds); a longer timeout returns after it.
MAX_WAIT_S = 300.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EnqueueBody(_Body):
    rollouts: list[Rollout]


class DequeueBody(_Body):
    worker_id: str | None = None
    attempt_id: str | None = None


class FinishAttemptBody(_Body):
    status: AttemptStatus
    reward: float | None = None
    error: str | None = None


class FinishRolloutBody(_Body):
    status: RolloutStatus
    reward: float | None = None


class SpansBody(_Body):
    spans: list[Span]
    # Sizes of consecutive slices of `spans` written as separate `add_spans` calls, each with its
    # own count or error in the answer: the client coalesces concurrent callers into one request.
    groups: list[Annotated[StoreInt, Field(ge=0)]] | None = None


class QueryBody(_Body):
    status: list[RolloutStatus] | None = None
    ids: list[str] | None = None
    mode: RolloutMode | None = None
    group_id: str | None = None
    limit: StoreInt | None = Field(default=None, ge=0)
    offset: StoreInt = Field(default=0, ge=0)


#: Query parameters of the GET routes, for the OpenAPI document.
_STATUS_NAMES: dict[str, Any] = {"type": "string", "enum": [status.value for status in RolloutStatus]}
LIST_QUERY: dict[str, dict[str, Any]] = {
    "status": {"type": "array", "items": _STATUS_NAMES},
    "ids": {"type": "array", "items": {"type": "string"}},
    "mode": {"type": "string", "enum": [mode.value for mode in RolloutMode]},
    "group_id": {"type": "string"},
    "limit": {"type": "integer", "minimum": 0},
    "offset": {"type": "integer", "minimum": 0},
}
SPANS_QUERY: dict[str, dict[str, Any]] = {"attempt_id": {"type": "string"}}


class OtlpTracesBody(BaseModel):
    """OTLP/JSON `ExportTraceServiceRequest` (protobuf is accepted too, as application/x-protobuf)."""

    resourceSpans: list[dict[str, Any]] = []  # OTLP's own field name


class WaitBody(_Body):
    rollout_ids: list[str]
    timeout: float = Field(ge=0)  # held at most `MAX_WAIT_S` (the server's `max_wait_s`)


class ResourcesBody(_Body):
    resources: dict[str, Resource]


class ReapBody(_Body):
    at: float | None = None


class BulkReadBody(_Body):
    """The bulk reads (`rollout_dicts`, `span_dicts`, `llm_columns`) of many rollouts at once."""

    rollout_ids: list[str]
    all_attempts: bool = False  # span_dicts
    arrays: bool = False  # span_dicts: lean LLM span dicts (ids as lists on the wire)
    tool_spans: bool = False  # llm_columns


_B = TypeVar("_B", bound=_Body)
_BODY_ADAPTERS: dict[type[_Body], TypeAdapter[Any]] = {}


def body_adapter(model: type[_B]) -> TypeAdapter[_B]:
    """A cached adapter for a request body model."""
    adapter = _BODY_ADAPTERS.get(model)
    if adapter is None:
        adapter = _BODY_ADAPTERS[model] = TypeAdapter(model)
    return adapter


def parse_body(model: type[_B], data: bytes) -> _B:
    """Validate a JSON body (an empty body is `{}`); ValidationError for anything wrong."""
    return body_adapter(model).validate_json(data or b"{}")


# -- errors -------------------------------------------------------------------------------------

# The error class of a status, for answers without a readable error body.
_ERRORS_BY_STATUS: dict[int, type[AlightError]] = {
    cls.http_status: cls
    for cls in (
        InvalidRequestError,
        NotFoundError,
        InvalidTransitionError,
        PayloadTooLargeError,
        StoreUnavailableError,
        UnauthorizedError,
        ForbiddenError,
    )
}


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": one_line(message)}})


def raised(status: int, error: Any, fallback: str) -> AlightError:
    """The exception the server raised, from its `{"code", "message"}` error object."""
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        cls = ERRORS_BY_CODE.get(error["code"]) or _ERRORS_BY_STATUS.get(status, StoreError)
        return cls(one_line(str(error.get("message", ""))))
    return _ERRORS_BY_STATUS.get(status, StoreError)(one_line(fallback))
