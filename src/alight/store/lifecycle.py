"""The rollout/attempt life cycle as pure functions, shared by every store implementation.

Each function takes the current records and returns the new ones (copies), or raises
`InvalidTransitionError`. Stores only load, call and save, so they cannot disagree on the rules:

    queuing --claim--> running --finish(succeeded)--> succeeded
       ^                  |------finish(failed|timeout)--> queuing   while attempts < max_attempts
       |__________________|                                failed | timeout otherwise
    any non-terminal --finish_rollout--> succeeded | failed | timeout | cancelled
"""

from __future__ import annotations

from pydantic import ValidationError

from alight.errors import InvalidRequestError, InvalidTransitionError
from alight.types import Attempt, AttemptStatus, Rollout, RolloutStatus


def admit(rollout: Rollout, at: float) -> Rollout:
    """The rollout as stored at enqueue time: store-managed fields reset."""
    return rollout.model_copy(
        update={
            "status": RolloutStatus.QUEUING,
            "attempt_count": 0,
            "reward": None,
            "created_at": at,
            "started_at": None,
            "ended_at": None,
        }
    )


def claim(rollout: Rollout, attempt_id: str, worker_id: str | None, at: float) -> tuple[Rollout, Attempt]:
    """A runner takes a queuing rollout: a new attempt in `preparing`, the rollout `running`."""
    if rollout.status is not RolloutStatus.QUEUING:
        raise InvalidTransitionError(f"rollout {rollout.rollout_id} is {rollout.status}, not queuing")
    try:
        attempt = Attempt(
            attempt_id=attempt_id,
            rollout_id=rollout.rollout_id,
            number=rollout.attempt_count + 1,
            worker_id=worker_id,
            timeout_s=rollout.timeout_s,
            heartbeat_timeout_s=rollout.heartbeat_timeout_s,
            claimed_at=at,
            last_heartbeat_at=at,
        )
    except ValidationError:
        raise InvalidRequestError(f"invalid attempt id {attempt_id!r}: no '/' or whitespace allowed") from None
    updated = rollout.model_copy(
        update={
            "status": RolloutStatus.RUNNING,
            "attempt_count": attempt.number,
            "started_at": rollout.started_at if rollout.started_at is not None else at,
        }
    )
    return updated, attempt


def start(attempt: Attempt, at: float) -> Attempt:
    """The agent starts: `preparing` -> `running` (idempotent when already running)."""
    if attempt.status is AttemptStatus.RUNNING:
        return attempt
    if attempt.status is not AttemptStatus.PREPARING:
        raise InvalidTransitionError(f"attempt {attempt.attempt_id} is {attempt.status}, cannot start")
    return attempt.model_copy(update={"status": AttemptStatus.RUNNING, "started_at": at, "last_heartbeat_at": at})


def heartbeat(attempt: Attempt, at: float) -> Attempt:
    """A live attempt reports it is alive; a finished one is told so (the runner should stop)."""
    if attempt.status.is_terminal:
        raise InvalidTransitionError(f"attempt {attempt.attempt_id} is {attempt.status}, not alive")
    return attempt.model_copy(update={"last_heartbeat_at": at})


def finish_attempt(
    rollout: Rollout,
    attempt: Attempt,
    status: AttemptStatus,
    at: float,
    *,
    reward: float | None = None,
    error: str | None = None,
) -> tuple[Rollout, Attempt]:
    """End an attempt; the rollout succeeds with the reward, is requeued, or ends with the attempt.

    Finishing again with the status the attempt already has changes nothing (a retried request);
    any other change to a finished attempt is an invalid transition.
    """
    if not status.is_terminal:
        raise InvalidRequestError(f"an attempt cannot be finished as {status}")
    if attempt.status.is_terminal:
        if attempt.status is status:
            return rollout, attempt
        raise InvalidTransitionError(
            f"attempt {attempt.attempt_id} already ended as {attempt.status}, cannot become {status}"
        )
    ended = attempt.model_copy(update={"status": status, "ended_at": at, "error": error})
    if attempt.number != rollout.attempt_count or rollout.status is not RolloutStatus.RUNNING:
        # A stale attempt (its rollout moved on): record its end, leave the rollout alone.
        return rollout, ended
    if status is AttemptStatus.SUCCEEDED:
        update = {"status": RolloutStatus.SUCCEEDED, "reward": reward, "ended_at": at}
    elif status is AttemptStatus.CANCELLED:
        update = {"status": RolloutStatus.CANCELLED, "ended_at": at}
    elif rollout.attempt_count < rollout.max_attempts:
        update = {"status": RolloutStatus.QUEUING}
    else:
        update = {"status": RolloutStatus(status.value), "ended_at": at}
    return rollout.model_copy(update=update), ended


def finish_rollout(
    rollout: Rollout,
    live_attempt: Attempt | None,
    status: RolloutStatus,
    at: float,
    *,
    reward: float | None = None,
) -> tuple[Rollout, Attempt | None]:
    """End a rollout from outside its attempt (cancel, or set a final reward).

    A live attempt ends with the same status. Finishing again with the same status only updates
    the reward; any other change to a finished rollout is an invalid transition.
    """
    if not status.is_terminal:
        raise InvalidRequestError(f"a rollout cannot be finished as {status}")
    if rollout.status.is_terminal:
        if rollout.status is status:
            new_reward = reward if reward is not None else rollout.reward
            return rollout.model_copy(update={"reward": new_reward}), None
        raise InvalidTransitionError(
            f"rollout {rollout.rollout_id} already ended as {rollout.status}, cannot become {status}"
        )
    ended_attempt = None
    if live_attempt is not None and not live_attempt.status.is_terminal:
        ended_attempt = live_attempt.model_copy(update={"status": AttemptStatus(status.value), "ended_at": at})
    updated = rollout.model_copy(
        update={
            "status": status,
            "reward": reward if reward is not None else rollout.reward,
            "ended_at": at,
        }
    )
    return updated, ended_attempt


def expire(rollout: Rollout, attempt: Attempt, at: float) -> tuple[Rollout, Attempt]:
    """Watchdog: a live attempt that missed its heartbeat or time limit times out (and counts
    against `max_attempts` like a failure)."""
    return finish_attempt(
        rollout, attempt, AttemptStatus.TIMEOUT, at, error="timed out: no heartbeat or time limit exceeded"
    )


def recover(rollout: Rollout, attempt: Attempt, at: float) -> tuple[Rollout, Attempt]:
    """After a crash of the store's host, an attempt that was live is lost: it ends as timed out
    and its rollout is requeued whatever its attempt count, since the agent did not fail."""
    ended = attempt.model_copy(
        update={
            "status": AttemptStatus.TIMEOUT,
            "ended_at": at,
            "error": "lost: the store's process stopped while this attempt was running",
        }
    )
    if attempt.number != rollout.attempt_count or rollout.status is not RolloutStatus.RUNNING:
        return rollout, ended
    return rollout.model_copy(update={"status": RolloutStatus.QUEUING}), ended
