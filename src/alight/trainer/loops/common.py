"""What the loops run the same way: a run's outer shape (signals, the checkpoint on stop, closing
the backend, the result) and the step-by-step drive of the step-based loops (RL, async RL, SFT from
a store), each loop's part in it a `StepPlan`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from alight.trainer.ledger import CONSUMED, consumed
from alight.trainer.policy import Policy
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.session import RunSession
from alight.trainer.stack import LocalStack
from alight.trainer.validation import Schedule, Validator

if TYPE_CHECKING:
    from alight.adapters import AdapterStats
    from alight.algorithms.batch import TransitionBatch
    from alight.algorithms.lightning import LightningRL
    from alight.backends.base import Backend
    from alight.trainer.loops import LoopInput
    from alight.types import Rollout

StepFn = Callable[[StepRollouts, int], Awaitable[dict[str, Any]]]


def rl_parts(run: LoopInput) -> tuple[RunSession, Policy, Validator, int]:
    """What an RL loop (sync or async) is built from: its session, policy, validator and steps."""
    cfg, t = run.cfg, run.cfg.trainer
    total_steps = t.steps or max(1, t.epochs * len(run.train_rows) // t.batch_size)
    session = RunSession(cfg, run.run_dir, resume=run.resume, watchers=run.watchers)
    policy = Policy(cfg, session)
    policy.total_steps = total_steps
    return session, policy, Validator(run.val_rows, cfg.data.input_field, t), total_steps


async def adapt(
    rollouts: StepRollouts, rl: LightningRL, policy: Policy, ended: Sequence[Rollout]
) -> tuple[TransitionBatch | None, AdapterStats | None, float]:
    """The proxy's spans flushed, then the succeeded rollouts' transitions, credit and advantages
    as a batch (None: nothing succeeded); returns (batch, adapter stats (None: nothing succeeded), seconds)."""
    clock = time.monotonic()
    await rollouts.flush()
    succeeded = [r.rollout_id for r in ended if r.status.value == "succeeded"]
    if not succeeded:
        return None, None, time.monotonic() - clock
    batch, stats = await rl.batch_from_store(rollouts.store, succeeded, policy.pad_id)
    return batch, stats, time.monotonic() - clock


async def update_and_serve(
    rollouts: StepRollouts, session: RunSession, policy: Policy, batch: TransitionBatch | None, step: int
) -> tuple[dict[str, float], float]:
    """Update the policy on `batch` and serve the new weights as version `step` (no batch: an
    error line, no update); returns the update's metrics and its seconds. A colocated backend
    updates with the engine asleep (calls wait); otherwise the runners go on meanwhile."""
    clock = time.monotonic()
    update: dict[str, float] = {}
    session.interrupt.updating = True  # a signal from here on lets the step end (the driver clears it)
    if batch is None:
        session.events.on_error(f"step {step}: no transitions to train on (no succeeded rollout with an LLM call)")
    else:
        backend = policy.backend
        assert backend is not None
        if backend.colocated:  # the engine sleeps: the update takes its accelerator memory
            update = await rollouts.offloaded(lambda: backend.update(batch))
        else:
            update = await asyncio.to_thread(_update, session, backend, batch)
        await rollouts.serve(backend.engine_weights(), step)
    return update, time.monotonic() - clock


def _update(session: RunSession, backend: Backend, batch: TransitionBatch) -> dict[str, float]:
    with session.threads.updating():  # in the thread that updates: torch's thread count is per thread
        return backend.update(batch)


async def train_metrics(
    rollouts: StepRollouts,
    step: int,
    ended: Sequence[Rollout],
    batch: TransitionBatch | None,
    update: dict[str, float],
    timings: dict[str, float],
    *,
    busy: Sequence[str],
    since: float,
) -> dict[str, Any]:
    """A training step's metrics: rewards and statuses of `ended`, the batch's size, the update's
    metrics, `timings` (rollout_s, adapt_s, update_s: seconds; generation_s: the seconds the
    throughputs are per), and the runners' utilisation on the `busy` rollouts since `since`
    (time.time())."""
    summary = await rollouts.summarise(ended, "train")
    tokens = float(batch.response_lengths.sum()) if batch is not None else 0.0
    update_tokens = update.pop("actor/update_tokens", 0.0)
    generation_s, update_s = timings["generation_s"], timings["update_s"]
    return {
        "step": step,
        **summary,
        "transitions": len(batch) if batch is not None else 0,
        "response_length/mean": tokens / len(batch) if batch is not None else 0.0,
        **update,
        "runners/utilisation": await rollouts.utilisation(busy, since, time.time()),
        "timing/rollout_s": timings["rollout_s"],
        "timing/adapt_s": timings["adapt_s"],
        "timing/update_s": update_s,
        "throughput/rollouts_per_s": len(ended) / generation_s if generation_s > 0 else 0.0,
        "throughput/tokens_per_s": tokens / generation_s if generation_s > 0 else 0.0,
        "throughput/update_tokens_per_s": update_tokens / update_s if update_s > 0 else 0.0,
        "weights_version": step if batch is not None else step - 1,
        **rollouts.faults(),
        CONSUMED: consumed(batch),  # to the run's ledger, not the metrics (alight.trainer.ledger)
    }


def execute(session: RunSession, policy: Policy, work: Callable[[], None]) -> FitResult:
    """Run `work` (signals handled: a stopped run checkpoints its last step), close the policy's
    backend, and return the run's result."""
    try:
        stopped = session.guarded(work, on_stop=policy.save_on_stop)
        return session.finish(stopped)
    finally:
        policy.close()


def step_info(session: RunSession, total_steps: int) -> dict[str, Any]:
    """What a step-based loop announces at its start (the session adds the run's name and history)."""
    cfg = session.cfg
    return {
        "total_steps": total_steps,
        "algorithm": cfg.algorithm.name,
        "model": cfg.engine.model,
        "n_runners": cfg.runner.n_runners,
        "batch_size": cfg.trainer.batch_size,
        "group_size": cfg.trainer.group_size,
        "warm_start_steps": cfg.warm_start.steps if cfg.warm_start.data and not session.resume else 0,
    }


def start_stack(session: RunSession, served: str, *, weights_version: int, **options: Any) -> LocalStack:
    """The run's stack (store, proxy + engine serving `served`, runners), not started yet."""
    session.events.on_stage("starting store, engine and runners", 0, 1)
    return LocalStack(session.cfg, session.run_dir, model=served, weights_version=weights_version, **options)


class StepPlan(Protocol):
    """What `drive_steps` leaves to a loop: the step-0 metrics, what comes before step 0 (`start`),
    one step (`step`: it advances `session.progress` and returns the step's metrics), and what
    comes after the last step or a signal, not after an error (`end`)."""

    step_zero: dict[str, Any]

    async def start(self, rollouts: StepRollouts, session: RunSession) -> None: ...
    async def step(self, rollouts: StepRollouts, step: int) -> dict[str, Any]: ...
    async def end(self, rollouts: StepRollouts) -> None: ...


class Steps:
    """The sync loops' plan (RL, SFT from a store): `one_step` per step; resuming, the rollouts a
    killed run had enqueued after its checkpoint are reused; nothing after the last step. (The async
    loop's plan is `alight.trainer.loops.async_rl.FedSteps`.)"""

    def __init__(self, step_zero: dict[str, Any], one_step: StepFn) -> None:
        self.step_zero = step_zero
        self.one_step = one_step

    async def start(self, rollouts: StepRollouts, session: RunSession) -> None:
        if session.resume:
            await rollouts.resume_after(session.progress.step)

    async def step(self, rollouts: StepRollouts, step: int) -> dict[str, Any]:
        return await self.one_step(rollouts, step)

    async def end(self, rollouts: StepRollouts) -> None:
        pass


async def drive_steps(
    session: RunSession, policy: Policy, stack: LocalStack, validator: Validator, schedule: Schedule, steps: StepPlan
) -> None:
    """`steps.start`, then step 0 (its metrics and, with validation rows, a validation) unless
    logged already, then `steps.step` for each step to the last, validating and checkpointing as
    `schedule` says, until the last step or a signal; then `steps.end`."""
    progress = session.progress
    store = stack.trainer_store()
    try:
        rollouts = StepRollouts(store, stack, session.cfg, session.events)
        await steps.start(rollouts, session)
        if progress.step == 0 and 0 not in session.logged_steps():
            metrics: dict[str, Any] = {"step": 0, "weights_version": 0, **steps.step_zero}
            if validator:
                metrics.update(await validator.run(rollouts, 0))
            session.record(metrics)
        while progress.step < schedule.total_steps and not session.stopping():
            step = progress.step + 1
            try:
                metrics = await steps.step(rollouts, step)
            finally:
                session.interrupt.updating = False  # set before the update: weights and step move together
            if validator and schedule.validates(step):
                metrics.update(await validator.unless_stopped(rollouts, step, session.stopping))
            session.record(metrics)
            if schedule.saves(step) or session.stopping():
                policy.save()
        await steps.end(rollouts)
    finally:
        await store.close()
