"""What the runner supervisor knows about each seat of its pool, the pool's counts, and when it kills a runner."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from alight.types import AttemptStatus

if TYPE_CHECKING:
    from alight.runner.transport import RunnerHandle


@dataclass(frozen=True)
class PoolStats:
    """Counts since the pool started."""

    attempts_succeeded: int = 0
    attempts_failed: int = 0  # the agent raised, or its worker died
    attempts_timed_out: int = 0
    attempts_ended_elsewhere: int = 0  # the store ended them first (watchdog, cancelled rollout)
    workers_started: int = 0
    workers_restarted: int = 0  # replacements of killed, dead or recycled workers
    workers_died: int = 0  # exited on their own without being asked (crash, signal, os._exit)
    workers_killed: int = 0  # killed by the supervisor (attempt past its timeout, drain timeout)
    workers_alive: int = 0
    workers_busy: int = 0  # holding an attempt now

    @property
    def attempts_finished(self) -> int:
        return self.attempts_succeeded + self.attempts_failed + self.attempts_timed_out + self.attempts_ended_elsewhere

    def plus(self, field: str) -> PoolStats:
        """These counts with `field` one higher."""
        return replace(self, **{field: getattr(self, field) + 1})

    def plus_attempt(self, status: AttemptStatus | None) -> PoolStats:
        """These counts with one more attempt ended as `status` (None: the store ended it first)."""
        field = {
            AttemptStatus.SUCCEEDED: "attempts_succeeded",
            AttemptStatus.TIMEOUT: "attempts_timed_out",
            None: "attempts_ended_elsewhere",
        }.get(status, "attempts_failed")
        return self.plus(field)


@dataclass
class Held:
    """The attempt a runner told the supervisor it holds."""

    attempt_id: str
    rollout_id: str
    timeout_s: float | None
    deadline: float | None  # the supervisor's clock time past which it kills the runner


@dataclass
class Seat:
    """One place in the pool: its current runner (replaced as runners die) and its state."""

    index: int
    generation: int = 0
    runner: RunnerHandle | None = None
    holding: Held | None = None
    ready: bool = False
    fatal: str | None = None
    crashes: int = 0  # consecutive deaths without a finished attempt in between
    restart_at: float | None = None
    kill_reason: tuple[AttemptStatus, str] | None = None
    retired: bool = False  # scaled away: its runner drains and is not replaced

    @property
    def alive(self) -> bool:
        return self.runner is not None and self.runner.alive


def kill_reason(
    held: Held | None, stalled: str | None, now: float, kill_grace_s: float, stop_deadline: float | None
) -> tuple[AttemptStatus, str] | None:
    """Why the supervisor kills a seat's runner at `now`, as (the status its attempt ends with, the
    reason), or None to let it run: the attempt it holds ran past its deadline (the rollout's timeout
    plus `kill_grace_s`), its transport finds it `stalled`, or the pool's `stop_deadline` passed."""
    if held is not None and held.deadline is not None and now > held.deadline:
        reason = (
            f"killed by the runner pool: the attempt ran past its timeout of {held.timeout_s:g} s "
            f"(+{kill_grace_s:g} s grace) and the agent did not stop"
        )
        return AttemptStatus.TIMEOUT, reason
    if stalled is not None:
        return AttemptStatus.TIMEOUT, f"killed by the runner pool: {stalled}"
    if stop_deadline is not None and now >= stop_deadline:
        return AttemptStatus.FAILED, "the runner pool stopped before the attempt finished"
    return None
