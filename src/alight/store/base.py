"""The `Store` protocol: the only channel between the algorithm side and the runner side.

Every implementation (in-memory, SQLite, the HTTP client) passes one conformance suite
(tests/store/test_conformance.py), so components take a `Store` and never care which one.
All methods are coroutines; errors are `alight.errors.StoreError` subclasses.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self

from alight.errors import NotFoundError
from alight.store.columns import LLMColumns, columns_from_spans
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
)

#: `query_spans(attempt_id=ALL_ATTEMPTS)` returns the spans of every attempt (as the default does).
ALL_ATTEMPTS: Literal["all"] = "all"
#: `query_spans(attempt_id=LATEST_ATTEMPT)` returns the spans of the rollout's latest attempt only.
LATEST_ATTEMPT: Literal["latest"] = "latest"


class Store(abc.ABC):
    """Rollouts, attempts, spans and resources, shared by the trainer, proxy and runners.

    Each kind is registered by name in `alight.store.factory.STORES` (`store.kind`) and states
    `kind`, `is_file`, `check_config` and `from_spec` (`alight.store.factory.StoreKind`)."""

    kind: ClassVar[str]
    #: A file another process may open beside its server (the trainer's columnar reads of SQLite).
    is_file: ClassVar[bool] = False

    # -- queue ------------------------------------------------------------------------------
    @abc.abstractmethod
    async def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Queue rollouts (status `queuing`), in order. Idempotent by `rollout_id`: a rollout
        that is already stored is returned as stored, unchanged."""

    @abc.abstractmethod
    async def dequeue(self, worker_id: str | None = None, *, attempt_id: str | None = None) -> Claim | None:
        """Atomically claim the oldest queuing rollout with a new attempt, or return None.

        No two callers ever get the same attempt. Passing `attempt_id` makes a retried call
        idempotent: if that attempt already exists, its claim is returned again.
        """

    @abc.abstractmethod
    async def start_attempt(self, attempt_id: str) -> Attempt:
        """Mark a claimed attempt `running` (the agent started)."""

    @abc.abstractmethod
    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Record that a live attempt is alive; raises InvalidTransitionError once it has ended."""

    @abc.abstractmethod
    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
    ) -> Rollout:
        """End an attempt. Succeeded: the rollout succeeds with `reward`. Failed or timed out: the
        rollout is requeued while it has attempts left, else it ends with that status."""

    @abc.abstractmethod
    async def finish_rollout(self, rollout_id: str, status: RolloutStatus, *, reward: float | None = None) -> Rollout:
        """End a rollout from outside its attempt (cancel it, or give its final reward)."""

    # -- spans ------------------------------------------------------------------------------
    @abc.abstractmethod
    async def add_spans(self, spans: Sequence[Span], *, write_id: str | None = None) -> int:
        """Store spans of known attempts; returns how many were new. Idempotent by
        (attempt_id, span_id): writing a span twice stores it once. Spans without a
        `sequence_id` get the next number of their attempt. A `write_id` already seen returns
        that write's count and writes nothing (`alight.store.write_ids`)."""

    @abc.abstractmethod
    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout ordered by attempt, then sequence id: of every attempt by default
        (or `ALL_ATTEMPTS`), of one attempt by its id, or of the latest with `LATEST_ATTEMPT`
        (what the trainer reads: a retried rollout's earlier attempts are not its result)."""

    # -- bulk reads: what the trainer reads each step ----------------------------------------
    # Every store answers these; the defaults build them from the methods above, one rollout at a
    # time. SQLite reads them in a few queries from binary columns, the HTTP client in one request.
    async def rollout_dicts(self, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The rollouts as plain dicts in Rollout's JSON shape, in the order given (duplicates once).
        NotFoundError for an unknown rollout."""
        return [(await self.get_rollout(i)).model_dump(mode="json") for i in dict.fromkeys(rollout_ids)]

    async def span_dicts(
        self, rollout_ids: Sequence[str], *, all_attempts: bool = False, arrays: bool = False
    ) -> dict[str, list[dict[str, Any]]]:
        """The spans of many rollouts as plain dicts in Span's JSON shape, keyed by rollout id in the
        order given, each list ordered as `query_spans` orders it (the latest attempt's spans, or
        with `all_attempts` every attempt's). With `arrays`, a store may give token ids and log-probs
        as read-only numpy arrays instead of lists, and an LLM span whose ids it holds as arrays as a
        lean dict (ids, kind, agent name, parent, times: what the adapter reads). NotFoundError for an
        unknown rollout; a rollout never claimed has no spans."""
        attempt = ALL_ATTEMPTS if all_attempts else LATEST_ATTEMPT
        out: dict[str, list[dict[str, Any]]] = {}
        for rollout_id in dict.fromkeys(rollout_ids):  # query_spans raises NotFoundError for an unknown id
            out[rollout_id] = [s.model_dump(mode="json") for s in await self.query_spans(rollout_id, attempt)]
        return out

    async def llm_columns(self, rollout_ids: Sequence[str], *, tool_spans: bool = False) -> LLMColumns:
        """The latest attempt of each rollout as columns (`alight.store.columns.LLMColumns`): its LLM
        spans with exact int32 ids and float64 log-probs as flat numpy arrays, its other spans as
        dicts (not agent spans; tool spans only with `tool_spans`). NotFoundError for an unknown
        rollout. The trainer's fastest read (`LightningRL.batch_from_store`)."""
        ids = list(dict.fromkeys(rollout_ids))
        rollouts = await self.rollout_dicts(ids)
        latest: list[str | None] = []
        spans: dict[str, list[Span]] = {}
        for rollout_id in ids:
            attempts = await self.list_attempts(rollout_id)
            latest.append(attempts[-1].attempt_id if attempts else None)
            if attempts:
                spans[rollout_id] = await self.query_spans(rollout_id, LATEST_ATTEMPT)
        return columns_from_spans(rollouts, latest, spans, tool_spans=tool_spans)

    # -- reading ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; NotFoundError for an unknown id."""

    @abc.abstractmethod
    async def list_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        ids: Sequence[str] | None = None,
        mode: RolloutMode | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts in enqueue order, filtered by every given criterion."""

    @abc.abstractmethod
    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""

    async def get_attempt(self, attempt_id: str) -> Attempt:
        """One attempt by id (NotFoundError for an unknown one); the HTTP store checks a runner's
        writes against its `worker_id`."""
        raise NotImplementedError(f"{type(self).__name__} cannot read one attempt by id")

    @abc.abstractmethod
    async def count_by_status(self) -> dict[RolloutStatus, int]:
        """Number of rollouts in each status (every status present, zero included)."""

    @abc.abstractmethod
    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float) -> list[Rollout]:
        """Wait until every listed rollout has ended or `timeout` seconds pass; return the ended
        ones, in the order of `rollout_ids`."""

    # -- resources --------------------------------------------------------------------------
    @abc.abstractmethod
    async def add_resources(self, resources: Mapping[str, Resource], *, write_id: str | None = None) -> ResourceSet:
        """Publish a new resource set; its version is one above the latest. A `write_id` already
        seen returns the set that write published and publishes nothing (`alight.store.write_ids`)."""

    @abc.abstractmethod
    async def get_latest_resources(self) -> ResourceSet | None:
        """The newest resource set, or None before the first is published."""

    @abc.abstractmethod
    async def get_resources(self, version: int) -> ResourceSet:
        """A resource set by version; NotFoundError for an unknown one."""

    # -- upkeep -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def reap_timed_out(self, at: float | None = None, *, write_id: str | None = None) -> list[Attempt]:
        """Watchdog: time out live attempts whose heartbeat or time limit has passed (at `at`,
        default now) and requeue their rollouts while attempts remain. Returns those attempts, in
        the order they were claimed. A `write_id` already seen returns that reap's answer and
        reaps nothing."""

    async def close(self) -> None:  # noqa: B027 - optional hook, most stores have nothing to close
        """Release connections and files."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def all_status_counts(counts: Mapping[str, int]) -> dict[RolloutStatus, int]:
    """Counts for every rollout status, zero where `counts` has none."""
    return {status: int(counts.get(status.value, 0)) for status in RolloutStatus}


def chosen_attempts(rollout_id: str, attempt_ids: list[str], attempt_id: str | None) -> list[str]:
    """The attempts `query_spans(rollout_id, attempt_id)` reads, of the rollout's `attempt_ids` (in
    order): all (None or `ALL_ATTEMPTS`), the last one (`LATEST_ATTEMPT`) or `attempt_id`;
    NotFoundError for one not in it."""
    if attempt_id is None or attempt_id == ALL_ATTEMPTS:
        return attempt_ids
    if attempt_id == LATEST_ATTEMPT:
        return attempt_ids[-1:]
    if attempt_id in attempt_ids:
        return [attempt_id]
    raise NotFoundError(f"attempt {attempt_id!r} is not in rollout {rollout_id!r}")


class EndSignal:
    """Wakes in-process waiters whenever some rollout ends (asyncio, one event loop)."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, timeout: float) -> None:
        """Return when `notify` is called or after `timeout` seconds."""
        if self._event is None:
            self._event = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


async def wait_until_ended(
    fetch_ended: Callable[[Sequence[str]], Awaitable[list[Rollout]]],
    rollout_ids: Sequence[str],
    timeout: float,
    signal: EndSignal,
    poll_s: float,
) -> list[Rollout]:
    """Shared `wait_for_rollouts`: re-check on every end signal, and every `poll_s` seconds for
    rollouts ended by other processes. Each check asks only for the rollouts not seen ended yet (an
    ended rollout stays ended), so a step's wait reads each rollout once, not once per ending.
    Returns the ended ones in the order of `rollout_ids` (duplicates once)."""
    wanted = list(dict.fromkeys(rollout_ids))
    found: dict[str, Rollout] = {}
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        for rollout in await fetch_ended([i for i in wanted if i not in found]):
            found[rollout.rollout_id] = rollout
        left = deadline - time.monotonic()
        if len(found) >= len(wanted) or left <= 0:
            return [found[i] for i in wanted if i in found]
        await signal.wait(min(poll_s, left))
