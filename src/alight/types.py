"""The data model: tasks, rollouts, attempts, spans, resources and transitions.

A *task* is one dataset sample. Enqueuing a task creates a *rollout* (one run of the agent on the
task); each try at running it is an *attempt*. While an attempt runs, tracers and the LLM proxy
write *spans* (LLM calls, tool calls, rewards, agent steps). The algorithm publishes versioned
*resources* (the LLM endpoint, prompt templates) that runners hand to the agent. The adapter turns
a rollout's spans into *transitions*, the unit the trainer consumes.
"""

from __future__ import annotations

import os
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, field_serializer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Token ids (or a 0/1 mask) as transitions may hold them: a list, or a numpy integer array.
TokenIds: TypeAlias = "list[int] | npt.NDArray[np.integer[Any]]"
#: Log-probs as transitions may hold them: a list, or a numpy float array.
LogProbs: TypeAlias = "list[float] | npt.NDArray[np.floating[Any]]"


def new_id(prefix: str) -> str:
    """A fresh random id such as ``ro-3f2a...`` (96 random bits)."""
    return f"{prefix}-{os.urandom(12).hex()}"


def new_trace_id() -> str:
    """A random OpenTelemetry trace id: 32 hex digits."""
    return os.urandom(16).hex()


def new_span_id() -> str:
    """A random OpenTelemetry span id: 16 hex digits."""
    return os.urandom(8).hex()


def now() -> float:
    """Wall-clock time in seconds since the epoch, the unit of every timestamp in the model."""
    return time.time()


#: An id of a rollout or attempt: it travels in URL paths, so no "/" and no whitespace.
Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^/\s]+$")]


#: An integer the store can hold (SQLite's signed 64 bits): larger ones are refused at the edge.
StoreInt = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class _Model(BaseModel):
    # NaN and infinities are refused: a stored NaN reads back as null and breaks every later read.
    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)


class RolloutStatus(StrEnum):
    """Where a rollout is in its life cycle."""

    QUEUING = "queuing"  # waiting for a runner (new, or requeued after a failed attempt)
    RUNNING = "running"  # an attempt holds it
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the last allowed attempt failed
    TIMEOUT = "timeout"  # the last allowed attempt timed out
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_ROLLOUT


_TERMINAL_ROLLOUT = frozenset(
    {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMEOUT, RolloutStatus.CANCELLED}
)


class AttemptStatus(StrEnum):
    """Where one attempt at a rollout is."""

    PREPARING = "preparing"  # claimed by a runner, agent not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self not in (AttemptStatus.PREPARING, AttemptStatus.RUNNING)


class RolloutMode(StrEnum):
    """Why a rollout runs: to train on, to validate with, or a dry run."""

    TRAIN = "train"
    VAL = "val"
    DEV = "dev"


class SpanKind(StrEnum):
    LLM = "llm"
    TOOL = "tool"
    REWARD = "reward"
    AGENT = "agent"
    OTHER = "other"


class SpanStatus(StrEnum):
    UNSET = "unset"
    OK = "ok"
    ERROR = "error"


class Task(_Model):
    """One dataset sample handed to the agent."""

    task_id: str = Field(default_factory=lambda: new_id("task"))
    input: Any  # any JSON value, usually a dict of the dataset row
    metadata: dict[str, Any] = Field(default_factory=dict)


class Rollout(_Model):
    """One run of the agent on a task, retried as new attempts up to `max_attempts`."""

    rollout_id: Id = Field(default_factory=lambda: new_id("ro"))
    task: Task
    mode: RolloutMode = RolloutMode.TRAIN
    group_id: str | None = None  # rollouts of one task sampled together (GRPO group)
    resources_version: StoreInt | None = None  # resource set to use; None: the latest at claim time
    max_attempts: int = Field(default=1, ge=1, le=2**63 - 1)
    timeout_s: float | None = Field(default=None, gt=0)  # wall-clock limit of one attempt
    heartbeat_timeout_s: float | None = Field(default=60.0, gt=0)  # silence that times an attempt out
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Managed by the store; values passed to enqueue are ignored.
    status: RolloutStatus = RolloutStatus.QUEUING
    attempt_count: StoreInt = 0
    reward: float | None = None
    created_at: float = 0.0
    started_at: float | None = None  # first claim
    ended_at: float | None = None


class Attempt(_Model):
    """One try at running a rollout, held by one runner."""

    attempt_id: Id = Field(default_factory=lambda: new_id("at"))
    rollout_id: Id
    number: int = Field(ge=1, le=2**63 - 1)  # 1 for the first attempt of the rollout
    status: AttemptStatus = AttemptStatus.PREPARING
    worker_id: str | None = None
    timeout_s: float | None = None  # copied from the rollout at claim time
    heartbeat_timeout_s: float | None = None
    claimed_at: float
    started_at: float | None = None
    last_heartbeat_at: float
    ended_at: float | None = None
    error: str | None = None  # message or traceback of a failed attempt

    def expired(self, at: float) -> bool:
        """True when a live attempt has outlived its timeout or missed its heartbeat at time `at`."""
        if self.status.is_terminal:
            return False
        if self.heartbeat_timeout_s is not None and at - self.last_heartbeat_at > self.heartbeat_timeout_s:
            return True
        begun = self.started_at if self.started_at is not None else self.claimed_at
        return self.timeout_s is not None and at - begun > self.timeout_s


class Claim(_Model):
    """What a runner gets from `dequeue`: the rollout and the attempt it now holds."""

    rollout: Rollout
    attempt: Attempt
    # The attempt's agent key, when the store server that answered has a token (alight.serving.credentials).
    agent_key: str | None = Field(default=None, repr=False)


class Span(_Model):
    """One recorded operation inside an attempt: an LLM call, a tool call, a reward, an agent step."""

    rollout_id: Id
    attempt_id: Id
    sequence_id: StoreInt | None = None  # order within the attempt; the store assigns it when None
    trace_id: str = Field(default_factory=new_trace_id)
    span_id: str = Field(default_factory=new_span_id)
    parent_id: str | None = None
    name: str
    kind: SpanKind = SpanKind.OTHER
    attributes: dict[str, Any] = Field(default_factory=dict)
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    status: SpanStatus = SpanStatus.UNSET
    status_message: str | None = None


class LLMResource(_Model):
    """An OpenAI-compatible endpoint and the model and sampling parameters to call it with."""

    type: Literal["llm"] = "llm"
    endpoint: str  # base URL; runners bind it to the rollout and attempt
    model: str
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    api_key: str | None = None


class PromptTemplate(_Model):
    """A prompt the algorithm may rewrite (APO); `engine` says how placeholders are filled."""

    type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["f-string", "jinja"] = "f-string"

    def format(self, **values: Any) -> str:
        """The prompt with its placeholders filled: `str.format` (f-string) or a Jinja template."""
        if self.engine == "jinja":
            import jinja2

            return str(jinja2.Template(self.template).render(**values))
        return self.template.format(**values)


Resource = Annotated[LLMResource | PromptTemplate, Field(discriminator="type")]


class ResourceSet(_Model):
    """A versioned set of named resources; the store numbers versions 1, 2, 3, ..."""

    version: StoreInt
    resources: dict[str, Resource]
    created_at: float


class Transition(_Model):
    """One (prompt, response, reward) sample the trainer learns from, cut from an LLM span.

    The adapter (`alight.adapters`) makes them; credit assignment sets `reward` and the advantage
    estimator `advantage` (`alight.algorithms.LightningRL` does both). Validation takes lists; the
    adapter's transitions (built with `unchecked`) hold the ids, log-probs and mask as it read
    them: lists, or numpy arrays from the store's bulk read (`SqliteStore.span_dicts(arrays=True)`).
    `model_dump`/`model_dump_json` give lists either way; compare arrays with numpy, not `==`.
    """

    # Made by alight, never read from a request: a -inf log-prob stays what the engine gave.
    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None = None  # one per response token; None: the backend recomputes
    reward: float
    agent_name: str | None = None
    step_index: int = 0  # position among the kept LLM calls (trajectory mode: merged sequences) of the attempt
    rollout_id: str
    attempt_id: str | None = None
    group_id: str | None = None
    span_id: str | None = None  # the LLM span it was cut from (trajectory mode: the first merged one)
    metadata: dict[str, Any] = Field(default_factory=dict)
    advantage: float | None = None  # set by the advantage estimator; None before
    response_mask: list[int] | None = None  # 1 on model-generated response tokens, 0 on inserted ones; None: all 1

    @field_serializer("prompt_ids", "response_ids", "response_logprobs", "response_mask")
    def _as_list(self, value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else value  # numpy arrays dump as lists

    @classmethod
    def unchecked(
        cls,
        prompt_ids: TokenIds,
        response_ids: TokenIds,
        reward: float,
        rollout_id: str,
        *,
        response_logprobs: LogProbs | None = None,
        agent_name: str | None = None,
        step_index: int = 0,
        attempt_id: str | None = None,
        group_id: str | None = None,
        span_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        advantage: float | None = None,
        response_mask: TokenIds | None = None,
    ) -> Transition:
        """A transition built without validation, about 10x faster than `model_construct`: for the
        adapter's hot path, whose inputs are already checked; ids, log-probs and mask may be numpy
        arrays. Equal to the validated model (of the same values as lists)."""
        transition = _new(cls)
        _set_dict(
            transition,
            {
                "prompt_ids": prompt_ids,
                "response_ids": response_ids,
                "response_logprobs": response_logprobs,
                "reward": reward,
                "agent_name": agent_name,
                "step_index": step_index,
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "group_id": group_id,
                "span_id": span_id,
                "metadata": {} if metadata is None else metadata,
                "advantage": advantage,
                "response_mask": response_mask,
            },
        )
        # Shared: every field counts as set, so pydantic's `fields_set.add` on assignment never changes it.
        _set_fields_set(transition, _TRANSITION_FIELDS)
        _set_extra(transition, None)
        _set_private(transition, None)
        return transition


_TRANSITION_FIELDS = set(Transition.model_fields)
# BaseModel's slots, set through their descriptors: cheaper than object.__setattr__ on the hot path.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
