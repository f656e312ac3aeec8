"""The trainer's side of the store for one step: enqueue groups of rollouts, wait for them with a
timeout and a partial-batch policy, serve new weights, and summarise what ended."""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from alight.config.schema import ExperimentConfig
from alight.errors import TrainingError
from alight.trainer.events import Watchers
from alight.types import Rollout, RolloutMode, RolloutStatus, Task

if TYPE_CHECKING:
    from alight.backends.base import EngineWeights
    from alight.proxy.proxy import Proxy
    from alight.store.base import Store
    from alight.trainer.stack import LocalStack

logger = logging.getLogger(__name__)

T = TypeVar("T")

MODES = {"train": RolloutMode.TRAIN, "val": RolloutMode.VAL}


def runner_utilisation(busy: Sequence[tuple[float, float]], n_runners: int, started: float, ended: float) -> float:
    """Share of `n_runners` runners' time in [`started`, `ended`] covered by the `busy` intervals
    (each clipped to the window; a runner holds one attempt at a time, so the intervals of one
    runner never overlap), at most 1."""
    window = ended - started
    if window <= 0 or n_runners <= 0:
        return 0.0
    covered = sum(max(0.0, min(b, ended) - max(a, started)) for a, b in busy)
    return min(1.0, covered / (n_runners * window))


class StepRollouts:
    """Rollouts of training and validation steps, tagged with `{"step", "split", "row"}` metadata."""

    def __init__(self, store: Store, stack: LocalStack, cfg: ExperimentConfig, events: Watchers) -> None:
        self.store = store
        self.stack = stack
        self.cfg = cfg
        self.events = events
        self.reusable: dict[tuple[str, int], list[str]] = {}  # (split, step) -> a killed run's rollouts

    async def resume_after(self, step: int, splits: Sequence[str] = tuple(MODES)) -> None:
        """Reuse, not enqueue again, the rollouts a killed run had enqueued for steps after `step`
        (of these splits)."""
        self.reusable = await self.enqueued_after(step, splits)

    async def collect(
        self, step: int, split: str, *batch: Any, stage: str | None = None, **options: Any
    ) -> list[Rollout]:
        """Enqueue the step's rollouts, `enqueue(step, split, *batch, **options)` (or, resuming, take
        those a killed run enqueued for it, with the seeds they had) and wait for them (`wait`)."""
        sampling = options.get("sampling")
        t = self.cfg.trainer
        ids = self.reusable.pop((split, step), None)
        if ids:
            self.seed_sampling(step, split, ids, sampling)
        ids = ids or await self.enqueue(step, split, *batch, **options)
        try:
            return await self.wait(step, ids, t.step_timeout_s, t.min_batch_fraction, stage=stage)
        finally:
            self.set_sampling(ids, None)

    async def enqueued_after(self, step: int, splits: Sequence[str] = tuple(MODES)) -> dict[tuple[str, int], list[str]]:
        """Rollouts a killed run had enqueued for steps after `step`, by (split, step), to reuse."""
        found: dict[tuple[str, int], list[str]] = {}
        for split, mode in MODES.items():
            if split not in splits:
                continue
            for rollout in await self.store.list_rollouts(mode=mode):
                at = rollout.metadata.get("step")
                if isinstance(at, int) and at > step and rollout.metadata.get("split") == split:
                    found.setdefault((split, at), []).append(rollout.rollout_id)
        if found:
            logger.info("resume: reusing the rollouts already enqueued for %s", sorted(found))
        return found

    async def enqueue(
        self,
        step: int,
        split: str,
        tasks: Sequence[Any],
        rows: Sequence[int],
        group_size: int,
        *,
        sampling: Mapping[str, Any] | None = None,
        resources_version: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        group_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """`group_size` rollouts of each task (one GRPO group per task); returns their ids. With
        `resources_version` they run with that resource set (else the latest); `metadata` is added
        to each rollout's. `group_ids` name the groups (also kept as the `group` metadata; default
        `{split}-s{step}-t{i}` for groups of more than one)."""
        runner = self.cfg.runner
        names = list(group_ids) if group_ids is not None else [f"{split}-s{step}-t{i}" for i in range(len(tasks))]
        extra = [{"group": name} if group_ids is not None else {} for name in names]
        rollouts = [
            Rollout(
                task=Task(input=task),
                mode=MODES[split],
                group_id=name if group_size > 1 or group_ids is not None else None,
                max_attempts=runner.max_attempts,
                timeout_s=runner.timeout_s,
                heartbeat_timeout_s=runner.heartbeat_timeout_s,
                resources_version=resources_version,
                metadata={**(metadata or {}), **more, "step": step, "split": split, "row": row},
            )
            for task, row, name, more in zip(tasks, rows, names, extra, strict=True)
            for _ in range(group_size)
        ]
        ids = [r.rollout_id for r in rollouts]
        self.seed_sampling(step, split, ids, sampling)  # before enqueueing: a runner may claim them at once
        await self.store.enqueue(rollouts)
        return ids

    def seed_sampling(self, step: int, split: str, ids: Sequence[str], sampling: Mapping[str, Any] | None) -> None:
        """Each rollout samples with its own seed, from the run's seed, the step and its position:
        the embedded engine gives a seeded request its own generator, so the draws do not depend
        on how concurrent agents' calls happen to be batched, and a seeded run repeats itself."""
        base = self.cfg.trainer.seed * 1_000_003 + step * 10_007 + (0 if split == "train" else 5_003)
        for i, rollout_id in enumerate(ids):
            self.set_sampling([rollout_id], {**(sampling or {}), "seed": (base + i * 7_919) % 2**31})

    def _proxy(self) -> Proxy:
        server = self.stack.proxy_server
        if server is None:
            raise RuntimeError("the stack is not started")
        return server.proxy

    def faults(self) -> dict[str, int]:
        """What the stack survived so far in this process: restarts of the engine's server, the proxy
        and the store server after they died, and runner workers that died or were killed."""
        stack, found = self.stack, {}
        if stack.proxy_server is not None:
            found["faults/engine_restarts"] = stack.proxy_server.proxy.engine.restarts
            found["faults/proxy_restarts"] = stack.proxy_server.restarts
        if stack.store_server is not None:
            found["faults/store_restarts"] = stack.store_server.restarts
        if stack.pool is not None:
            stats = stack.pool.stats()
            found["faults/runners_died"], found["faults/runners_killed"] = stats.workers_died, stats.workers_killed
        return found

    def set_sampling(self, ids: Sequence[str], sampling: Mapping[str, Any] | None) -> None:
        self._proxy().set_rollout_sampling(ids, sampling)

    async def wait(
        self, step: int, ids: Sequence[str], timeout_s: float, min_fraction: float, *, stage: str | None = None
    ) -> list[Rollout]:
        """Wait for the rollouts to end; at the timeout, cancel the rest and go on with those that
        ended if they are at least `min_fraction` of all, else raise TrainingError."""
        deadline = time.monotonic() + timeout_s
        while True:
            ended = await self.store.wait_for_rollouts(ids, timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            counts = Counter(r.status.value for r in await self.store.list_rollouts(ids=list(ids)))
            if stage is None:
                self.events.on_rollouts(step, dict(counts))
            else:
                self.events.on_stage(stage, len(ended), len(ids), {})
            if len(ended) == len(ids):
                return list(ended)
            if time.monotonic() >= deadline:
                break
        if len(ended) < min_fraction * len(ids):
            raise TrainingError(
                f"step {step}: only {len(ended)} of {len(ids)} rollouts ended within "
                f"trainer.step_timeout_s={timeout_s:g}; are the runners alive? "
                f"(trainer.min_batch_fraction={min_fraction:g})"
            )
        done = {r.rollout_id for r in ended}
        for rollout_id in ids:
            if rollout_id not in done:
                await self.store.finish_rollout(rollout_id, RolloutStatus.CANCELLED)
        self.events.on_error(f"step {step}: {len(ids) - len(ended)} rollouts still running at the timeout: cancelled")
        return list(ended)

    async def flush(self) -> None:
        """Every answered LLM call's span is in the store on return."""
        await self._proxy().flush()

    async def offloaded(self, work: Callable[[], T]) -> T:
        """`work()` with the engine asleep and calls held (a colocated backend's update)."""
        result: T = await self._proxy().offloaded(work)
        return result

    async def serve(self, weights: EngineWeights, version: int) -> None:
        """The engine serves `weights` as `version`; a new resource version tells runners so."""
        await self._proxy().update_weights(weights, version)
        await self.store.add_resources(self.stack.resources())

    async def summarise(self, ended: Sequence[Rollout], split: str) -> dict[str, Any]:
        """Reward mean/std (failed rollouts count 0), tool-call rate and statuses; errors reported."""
        rewards = [r.reward if r.reward is not None else 0.0 for r in ended]
        statuses = Counter(r.status.value for r in ended)
        tools = await self._tool_call_rate([r.rollout_id for r in ended])
        out: dict[str, Any] = {
            f"{split}/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            f"{split}/tool_call_rate": tools,
        }
        if split == "train":
            out["train/reward_std"] = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
            for status in ("succeeded", "failed", "timeout", "cancelled"):
                out[f"rollouts/{status}"] = statuses.get(status, 0)
        await self._report_errors([r for r in ended if r.status.value in ("failed", "timeout")])
        return out

    async def utilisation(self, ids: Sequence[str], started: float, ended: float) -> float:
        """Share of the runners' wall time in [`started`, `ended`] (time.time()) spent on attempts
        of these rollouts (`runner_utilisation`); 0 when no runner runs here."""
        n = self.stack.n_runners
        if n <= 0 or ended <= started or not ids:
            return 0.0
        spans = []
        for rollout_id in dict.fromkeys(ids):
            for attempt in await self.store.list_attempts(rollout_id):
                spans.append((attempt.claimed_at, attempt.ended_at if attempt.ended_at is not None else ended))
        return runner_utilisation(spans, n, started, ended)

    async def _tool_call_rate(self, ids: Sequence[str]) -> float:
        """Fraction of the rollouts whose latest attempt made at least one tool call."""
        if not ids:
            return 0.0
        spans = await self.store.span_dicts(list(ids))
        kinds = {rid: {s.get("kind") for s in rows} for rid, rows in spans.items()}
        return sum(1 for rid in ids if "tool" in kinds.get(rid, set())) / len(ids)

    async def _report_errors(self, failed: Sequence[Rollout], limit: int = 3) -> None:
        for rollout in failed[:limit]:
            attempts = await self.store.list_attempts(rollout.rollout_id)
            error = next((a.error for a in reversed(attempts) if a.error), None)
            last = error.strip().splitlines()[-1] if error and error.strip() else rollout.status.value
            self.events.on_error(f"rollout {rollout.rollout_id}: {last}")
        if len(failed) > limit:
            self.events.on_error(f"... and {len(failed) - limit} more failed rollouts")
