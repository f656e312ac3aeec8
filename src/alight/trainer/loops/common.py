"""What the loops run the same way: a run's outer shape (signals, the checkpoint on stop, closing
the backend, the result) and the step-by-step drive of the step-based loops (RL, SFT from a store)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from alight.trainer.policy import Policy
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.session import RunSession
from alight.trainer.stack import LocalStack
from alight.trainer.validation import Schedule, Validator

StepFn = Callable[[StepRollouts, int], Awaitable[dict[str, Any]]]


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


async def drive_steps(
    session: RunSession,
    policy: Policy,
    stack: LocalStack,
    validator: Validator,
    schedule: Schedule,
    step_zero: dict[str, Any],
    one_step: StepFn,
) -> None:
    """Step 0 (its metrics and, with validation rows, a validation) unless logged already, then
    `one_step` for each step to the last (it advances `session.progress`), validating and
    checkpointing as `schedule` says, until the last step or a signal."""
    progress = session.progress
    store = stack.trainer_store()
    try:
        rollouts = StepRollouts(store, stack, session.cfg, session.events)
        if session.resume:
            await rollouts.resume_after(progress.step)
        if progress.step == 0 and 0 not in session.logged_steps():
            metrics: dict[str, Any] = {"step": 0, "weights_version": 0, **step_zero}
            if validator:
                metrics.update(await validator.run(rollouts, 0))
            session.record(metrics)
        while progress.step < schedule.total_steps and not session.stopping():
            step = progress.step + 1
            try:
                metrics = await one_step(rollouts, step)
            finally:
                session.interrupt.updating = False  # set before the update: weights and step move together
            if validator and schedule.validates(step):
                metrics.update(await validator.unless_stopped(rollouts, step, session.stopping))
            session.record(metrics)
            if schedule.saves(step) or session.stopping():
                policy.save()
    finally:
        await store.close()
