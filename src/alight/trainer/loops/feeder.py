"""The async loop's side of the store: groups of rollouts fed to the runners continuously within a
staleness bound, taken for training as soon as enough are complete, and accounted for.

The bound (AReaL's rule): at most `(1 + max_staleness) * batch_size` groups are outstanding
(enqueued, not yet trained, dropped or requeued), so generation never runs more than
`max_staleness` updates ahead of the trainer. A complete group's staleness is the version being
updated minus the version that served its oldest LLM call; a group over the bound is dropped or
requeued (its task enqueued again as a fresh group), as `trainer.on_stale` says, and counted.
With `max_staleness: 0` one batch is outstanding at a time and every group is fresh: the
synchronous algorithm.

Group ids are deterministic (`train-b{batch}-t{i}`, a requeue adds `-r{n}`) and a batch's rows
come from the seeded sampler, so a resumed run finds the groups a killed run had enqueued.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from alight import semconv
from alight.errors import TrainingError
from alight.types import Rollout, RolloutMode, RolloutStatus

if TYPE_CHECKING:
    from alight.trainer.rollouts import StepRollouts
    from alight.trainer.sampler import TaskSampler

logger = logging.getLogger(__name__)

POLL_S = 0.1  # how often the trainer looks for newly complete groups


@dataclass
class Group:
    """One task's `group_size` rollouts: its id, data row, the batch that enqueued it (its seeds),
    the rollout ids, and (once complete and checked) its staleness."""

    gid: str
    row: int
    batch: int
    ids: list[str]
    requeues: int = 0
    staleness: int = field(default=0, compare=False)


def oldest_version(spans: list[dict[str, Any]]) -> int | None:
    """The lowest weights version that served one of these spans' LLM calls (None: no LLM call)."""
    versions = [
        v
        for s in spans
        if s.get("kind") == "llm" and isinstance(v := (s.get("attributes") or {}).get(semconv.RESOURCES_VERSION), int)
    ]
    return min(versions) if versions else None


def staleness(version: int, oldest: int | None) -> int:
    """How many updates behind `version` (the weights being updated) a group served from `oldest` is."""
    return 0 if oldest is None else max(0, version - oldest)


class Feeder:
    """Feeds the runners and hands the trainer complete groups (see the module docstring)."""

    def __init__(
        self,
        rollouts: StepRollouts,
        rows: list[dict[str, Any]],
        sampler: TaskSampler,
        *,
        batch_size: int,
        group_size: int,
        max_staleness: int,
        on_stale: str,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.rollouts = rollouts
        self.rows = rows
        self.sampler = sampler
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.outstanding: dict[str, Group] = {}  # in enqueue order
        self.retry: list[Group] = []  # requeued tasks waiting for room under the bound
        self.batches = 0  # batches drawn from the sampler so far
        self.counts: Counter[str] = Counter()  # dropped, requeued, resume_*: totals
        self.set_aside: list[str] = []  # rollouts of stale groups since the last step took them
        self.reusable: dict[str, list[str]] = {}  # gid -> a killed run's rollouts for a group not yet enqueued
        self._seen_ended: set[str] = set()  # outstanding rollouts seen ended (an ended rollout stays ended)
        if state:
            self.batches = int(state["batches"])
            self.outstanding = {g["gid"]: Group(**g) for g in state["outstanding"]}
            self.retry = [Group(**g) for g in state["retry"]]
            self.counts.update(state["counts"])

    # -- checkpoint --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to continue: batches drawn, the groups outstanding, the totals."""
        return {
            "batches": self.batches,
            "outstanding": [asdict(g) for g in self.outstanding.values()],
            "retry": [asdict(g) for g in self.retry],
            "counts": dict(self.counts),
        }

    @property
    def capacity(self) -> int:
        """Most groups outstanding at once: `(1 + max_staleness) * batch_size`."""
        return (1 + self.max_staleness) * self.batch_size

    # -- feeding -----------------------------------------------------------------------------------
    async def top_up(self) -> int:
        """Enqueue requeued tasks, then whole batches from the sampler, while the bound allows;
        returns the groups enqueued."""
        added = 0
        while self.retry and len(self.outstanding) < self.capacity:
            group = self.retry.pop(0)
            await self._enqueue([group])
            added += 1
        while len(self.outstanding) + self.batch_size <= self.capacity:
            self.batches += 1
            indices = self.sampler.next_batch()
            groups = [Group(f"train-b{self.batches}-t{i}", row, self.batches, []) for i, row in enumerate(indices)]
            await self._enqueue(groups)
            added += len(groups)
        return added

    async def _enqueue(self, groups: list[Group]) -> None:
        from alight.data import task_input

        fresh = []
        for group in groups:
            group.ids = self.reusable.pop(group.gid, [])
            self.outstanding[group.gid] = group
            if not group.ids:
                fresh.append(group)
        for batch in sorted({g.batch for g in fresh}):
            part = [g for g in fresh if g.batch == batch]
            field_ = self.rollouts.cfg.data.input_field
            tasks = [task_input(self.rows[g.row], field_) for g in part]
            ids = await self.rollouts.enqueue(
                batch,
                "train",
                tasks,
                [g.row for g in part],
                self.group_size,
                group_ids=[g.gid for g in part],
            )
            for i, group in enumerate(part):
                group.ids = ids[i * self.group_size : (i + 1) * self.group_size]

    # -- taking ------------------------------------------------------------------------------------
    async def take(self, version: int, timeout_s: float, min_fraction: float) -> list[Group]:
        """Wait for `batch_size` complete groups no staler than the bound at `version` (the weights
        being updated), oldest enqueued first among those complete at once; staler ones are dropped
        or requeued on the way. At the timeout, go on with those taken if they are at least
        `min_fraction` of a batch, else raise TrainingError. Takes them out of `outstanding`."""
        deadline = time.monotonic() + timeout_s
        taken: list[Group] = []
        while len(taken) < self.batch_size:
            for group in await self._complete():
                group.staleness = staleness(version, await self._oldest(group))
                del self.outstanding[group.gid]
                if group.staleness > self.max_staleness:
                    await self._stale(group)
                else:
                    taken.append(group)
                if len(taken) == self.batch_size:
                    break
            if len(taken) == self.batch_size:
                break
            await self.top_up()  # dropped or requeued groups freed room
            if time.monotonic() >= deadline:
                if taken and len(taken) >= min_fraction * self.batch_size:
                    logger.warning("timeout: training on %d of %d groups", len(taken), self.batch_size)
                    break
                raise TrainingError(
                    f"only {len(taken)} of {self.batch_size} groups completed within "
                    f"trainer.step_timeout_s={timeout_s:g}; are the runners alive? "
                    f"(trainer.min_batch_fraction={min_fraction:g})"
                )
            self.rollouts.events.on_rollouts(version + 1, self._status_counts())
        return taken

    async def _complete(self) -> list[Group]:
        """Outstanding groups all of whose rollouts ended, in enqueue order (waits up to POLL_S)."""
        ids = [i for g in self.outstanding.values() for i in g.ids]
        if not ids:
            return []
        self._seen_ended &= set(ids)  # forget those taken, dropped or requeued since
        waiting = [i for i in ids if i not in self._seen_ended]  # ask the store only about these
        if waiting:
            ended = await self.rollouts.store.wait_for_rollouts(waiting, timeout=POLL_S)
            self._seen_ended.update(r.rollout_id for r in ended)
        return [g for g in list(self.outstanding.values()) if all(i in self._seen_ended for i in g.ids)]

    async def _oldest(self, group: Group) -> int | None:
        spans = await self.rollouts.store.span_dicts(group.ids)
        olds = [v for rows in spans.values() if (v := oldest_version(rows)) is not None]
        return min(olds) if olds else None

    async def _stale(self, group: Group) -> None:
        self.set_aside += group.ids  # not trained on: the step's ledger line says so
        if self.on_stale == "requeue":
            self.counts["requeued"] += 1
            again = group.requeues + 1
            self.retry.append(Group(f"{group.gid.split('-r')[0]}-r{again}", group.row, group.batch, [], again))
        else:
            self.counts["dropped"] += 1

    def _status_counts(self) -> dict[str, int]:
        return {"outstanding_groups": len(self.outstanding)}

    # -- resuming and ending -----------------------------------------------------------------------
    async def resume(self, since: float) -> None:
        """After a restart: the groups a killed run had enqueued after its checkpoint are reused
        when their batch comes again (not enqueued twice). Attempts that were in flight when it
        died are requeued by the store (crash recovery, or their heartbeat timeout): counted under
        `resume_in_flight` (attempts claimed before `since`, this run's start by time.time(), and
        not ended before it); their reruns serve from the resumed weights."""
        found: dict[str, list[str]] = {}
        for rollout in await self.rollouts.store.list_rollouts(mode=RolloutMode.TRAIN):
            gid = rollout.metadata.get("group")
            if rollout.metadata.get("split") == "train" and isinstance(gid, str):
                found.setdefault(gid, []).append(rollout.rollout_id)
        live = set(self.outstanding) | {g.gid for g in self.retry}
        self.reusable = {gid: ids for gid, ids in found.items() if gid not in live and self._later(gid)}
        ids = [i for g in self.outstanding.values() for i in g.ids] + [i for v in self.reusable.values() for i in v]
        lost = 0
        for rollout_id in ids:  # attempts claimed before this run began and not ended then
            attempts = await self.rollouts.store.list_attempts(rollout_id)
            lost += any(a.claimed_at < since and (a.ended_at is None or a.ended_at >= since) for a in attempts)
        self.counts["resume_in_flight"] += lost
        if lost:
            logger.info("resume: %d rollouts were in flight; the store runs them again", lost)

    def _later(self, gid: str) -> bool:
        """Whether `gid` belongs to a batch drawn after the checkpoint (not a requeue)."""
        head = gid.split("-r")[0]
        return "-r" not in gid and int(head.split("-b")[1].split("-t")[0]) > self.batches

    async def _ended(self, ids: list[str]) -> list[Rollout]:
        if not ids:
            return []
        return [r for r in await self.rollouts.store.list_rollouts(ids=ids) if r.status.is_terminal]

    async def _cancel(self, ids: list[str]) -> None:
        for rollout_id in ids:
            try:
                await self.rollouts.store.finish_rollout(rollout_id, RolloutStatus.CANCELLED)
            except Exception as err:  # it may have ended meanwhile
                logger.debug("cancel %s: %s", rollout_id, err)

    async def close(self) -> None:
        """Cancel the groups still outstanding (the run ended; runners stop working on them)."""
        ids = [i for g in self.outstanding.values() for i in g.ids]
        ended = {r.rollout_id for r in await self._ended(ids)}
        running = [i for i in ids if i not in ended]
        await self._cancel(running)
        groups = len(self.outstanding)
        logger.info("end: cancelled %d rollouts of the %d groups still outstanding", len(running), groups)
