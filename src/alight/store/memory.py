"""In-memory store: one process, one event loop; for tests and short dry runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from alight.errors import ConfigError, NotFoundError
from alight.store import lifecycle
from alight.store.base import EndSignal, Store, all_status_counts, chosen_attempts, wait_until_ended
from alight.store.factory import OpenOptions, StoreSpec, refuse_url
from alight.store.write_ids import MemoryWriteIds, WriteIdLimits, attempts_from_json, attempts_json
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
    new_id,
    now,
)

if TYPE_CHECKING:
    from alight.config.schema import StoreConfig


class MemoryStore(Store):
    """Every record in dicts. Methods never await between reading and writing, so each
    operation is atomic on its event loop."""

    kind = "memory"

    @classmethod
    def check_config(cls, cfg: StoreConfig) -> StoreSpec:
        refuse_url(cfg, cls.kind)
        if cfg.path:
            raise ConfigError(f"store.path is set but store.kind={cls.kind}: a memory store has no file")
        return StoreSpec(cls.kind)

    @classmethod
    def from_spec(cls, spec: StoreSpec, options: OpenOptions) -> MemoryStore:
        return cls(write_id_limits=options.write_id_limits)

    def __init__(self, *, write_id_limits: WriteIdLimits | None = None) -> None:
        self._rollouts: dict[str, Rollout] = {}  # insertion order is enqueue order
        self._seq: dict[str, int] = {}  # rollout id -> enqueue position
        self._queue: dict[str, None] = {}  # queuing rollout ids, oldest first
        self._live: dict[str, None] = {}  # attempts preparing or running, in claim order
        self._attempts: dict[str, Attempt] = {}
        self._attempts_of: dict[str, list[str]] = {}
        self._spans: dict[str, dict[str, Span]] = {}  # attempt_id -> span_id -> span
        self._last_seq: dict[str, int] = {}  # attempt_id -> highest span sequence id
        self._resources: list[ResourceSet] = []
        self._ended = EndSignal()
        self._write_ids = MemoryWriteIds(write_id_limits or WriteIdLimits())

    # -- records ----------------------------------------------------------------------------
    def _rollout(self, rollout_id: str) -> Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError(f"unknown rollout {rollout_id!r}") from None

    def _attempt(self, attempt_id: str) -> Attempt:
        try:
            return self._attempts[attempt_id]
        except KeyError:
            raise NotFoundError(f"unknown attempt {attempt_id!r}") from None

    def _save_attempt(self, attempt: Attempt) -> None:
        self._attempts[attempt.attempt_id] = attempt
        if attempt.status.is_terminal:
            self._live.pop(attempt.attempt_id, None)
        else:
            self._live.setdefault(attempt.attempt_id)

    def _save_rollout(self, rollout: Rollout) -> None:
        self._rollouts[rollout.rollout_id] = rollout
        if rollout.status is RolloutStatus.QUEUING:
            # A requeued rollout keeps its place: the queue is ordered by enqueue position.
            self._queue[rollout.rollout_id] = None
            self._queue = dict.fromkeys(sorted(self._queue, key=self._seq.__getitem__))
        else:
            self._queue.pop(rollout.rollout_id, None)
        if rollout.status.is_terminal:
            self._ended.notify()

    # -- queue ------------------------------------------------------------------------------
    async def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        at = now()
        stored = []
        for rollout in rollouts:
            if rollout.rollout_id not in self._rollouts:
                admitted = lifecycle.admit(rollout, at)
                self._rollouts[admitted.rollout_id] = admitted
                self._seq[admitted.rollout_id] = len(self._seq)
                self._queue[admitted.rollout_id] = None
                self._attempts_of[admitted.rollout_id] = []
            stored.append(self._rollouts[rollout.rollout_id])
        return stored

    async def dequeue(self, worker_id: str | None = None, *, attempt_id: str | None = None) -> Claim | None:
        if attempt_id is not None and attempt_id in self._attempts:
            attempt = self._attempts[attempt_id]
            return Claim(rollout=self._rollouts[attempt.rollout_id], attempt=attempt)
        if not self._queue:
            return None
        rollout_id = next(iter(self._queue))
        rollout, attempt = lifecycle.claim(self._rollouts[rollout_id], attempt_id or new_id("at"), worker_id, now())
        self._save_rollout(rollout)
        self._save_attempt(attempt)
        self._attempts_of[rollout_id].append(attempt.attempt_id)
        return Claim(rollout=rollout, attempt=attempt)

    async def start_attempt(self, attempt_id: str) -> Attempt:
        attempt = lifecycle.start(self._attempt(attempt_id), now())
        self._save_attempt(attempt)
        return attempt

    async def heartbeat(self, attempt_id: str) -> Attempt:
        attempt = lifecycle.heartbeat(self._attempt(attempt_id), now())
        self._save_attempt(attempt)
        return attempt

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
    ) -> Rollout:
        attempt = self._attempt(attempt_id)
        rollout, attempt = lifecycle.finish_attempt(
            self._rollouts[attempt.rollout_id], attempt, status, now(), reward=reward, error=error
        )
        self._save_attempt(attempt)
        self._save_rollout(rollout)
        return rollout

    async def finish_rollout(self, rollout_id: str, status: RolloutStatus, *, reward: float | None = None) -> Rollout:
        rollout = self._rollout(rollout_id)
        attempt_ids = self._attempts_of[rollout_id]
        live = self._attempts[attempt_ids[-1]] if attempt_ids else None
        rollout, attempt = lifecycle.finish_rollout(rollout, live, status, now(), reward=reward)
        if attempt is not None:
            self._save_attempt(attempt)
        self._save_rollout(rollout)
        return rollout

    # -- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span], *, write_id: str | None = None) -> int:
        known = self._write_ids.recall(write_id, "spans")
        if known is not None:
            return int(known)
        for span in spans:  # validate the whole batch before writing any of it
            attempt = self._attempt(span.attempt_id)
            if attempt.rollout_id != span.rollout_id:
                raise NotFoundError(f"attempt {span.attempt_id!r} is not in rollout {span.rollout_id!r}")
        added = 0
        for span in spans:
            stored = self._spans.setdefault(span.attempt_id, {})
            if span.span_id in stored:
                continue
            last = self._last_seq.get(span.attempt_id, 0)
            if span.sequence_id is None:
                span = span.model_copy(update={"sequence_id": last + 1})
            self._last_seq[span.attempt_id] = max(last, span.sequence_id or 0)
            stored[span.span_id] = span
            added += 1
        self._write_ids.remember(write_id, "spans", str(added))
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        attempt_ids = self._attempts_of.get(rollout_id)
        if attempt_ids is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")
        spans: list[Span] = []
        for aid in chosen_attempts(rollout_id, attempt_ids, attempt_id):
            spans.extend(sorted(self._spans.get(aid, {}).values(), key=lambda s: s.sequence_id or 0))
        return spans

    # -- reading ----------------------------------------------------------------------------
    async def get_rollout(self, rollout_id: str) -> Rollout:
        return self._rollout(rollout_id)

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
        if ids is not None:
            wanted = set(ids)
            candidates = [r for r in self._rollouts.values() if r.rollout_id in wanted]
        else:
            candidates = list(self._rollouts.values())
        statuses = set(status) if status is not None else None
        selected = [
            r
            for r in candidates
            if (statuses is None or r.status in statuses)
            and (mode is None or r.mode == mode)
            and (group_id is None or r.group_id == group_id)
        ]
        end = None if limit is None else offset + limit
        return selected[offset:end]

    async def get_attempt(self, attempt_id: str) -> Attempt:
        return self._attempt(attempt_id)

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        self._rollout(rollout_id)
        return [self._attempts[a] for a in self._attempts_of[rollout_id]]

    async def count_by_status(self) -> dict[RolloutStatus, int]:
        counts: dict[str, int] = {}
        for rollout in self._rollouts.values():
            counts[rollout.status.value] = counts.get(rollout.status.value, 0) + 1
        return all_status_counts(counts)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float) -> list[Rollout]:
        async def ended(ids: Sequence[str]) -> list[Rollout]:
            found = (self._rollouts.get(i) for i in dict.fromkeys(ids))
            return [r for r in found if r is not None and r.status.is_terminal]

        return await wait_until_ended(ended, rollout_ids, timeout, self._ended, poll_s=1.0)

    # -- resources --------------------------------------------------------------------------
    async def add_resources(self, resources: Mapping[str, Resource], *, write_id: str | None = None) -> ResourceSet:
        known = self._write_ids.recall(write_id, "resources")
        if known is not None:
            return ResourceSet.model_validate_json(known)
        resource_set = ResourceSet(version=len(self._resources) + 1, resources=dict(resources), created_at=now())
        self._resources.append(resource_set)
        self._write_ids.remember(write_id, "resources", resource_set.model_dump_json())
        return resource_set

    async def get_latest_resources(self) -> ResourceSet | None:
        return self._resources[-1] if self._resources else None

    async def get_resources(self, version: int) -> ResourceSet:
        if not 1 <= version <= len(self._resources):
            raise NotFoundError(f"unknown resources version {version}")
        return self._resources[version - 1]

    # -- upkeep -----------------------------------------------------------------------------
    async def reap_timed_out(self, at: float | None = None, *, write_id: str | None = None) -> list[Attempt]:
        known = self._write_ids.recall(write_id, "reap")
        if known is not None:
            return attempts_from_json(known)
        at = now() if at is None else at
        expired = [a for a in map(self._attempts.__getitem__, self._live) if a.expired(at)]
        reaped = []
        for attempt in expired:
            rollout, ended = lifecycle.expire(self._rollouts[attempt.rollout_id], attempt, at)
            self._save_attempt(ended)
            self._save_rollout(rollout)
            reaped.append(ended)
        self._write_ids.remember(write_id, "reap", attempts_json(reaped))
        return reaped
