"""What the runner pool's supervisor knows about each worker process, and the pool's counts."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from alight.types import AttemptStatus


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


@dataclass
class Held:
    """The attempt a worker told the supervisor it holds."""

    attempt_id: str
    rollout_id: str
    timeout_s: float | None
    deadline: float | None  # monotonic time past which the supervisor kills the worker


@dataclass
class Slot:
    """One place in the pool: its current worker process (replaced as workers die) and its state."""

    index: int
    generation: int = 0
    process: BaseProcess | None = None
    conn: Connection | None = None
    holding: Held | None = None
    ready: bool = False
    fatal: str | None = None
    crashes: int = 0  # consecutive deaths without a finished attempt in between
    restart_at: float | None = None
    kill_reason: tuple[AttemptStatus, str] | None = None
    retired: bool = False  # scaled away: its worker drains and is not replaced


def alive(process: BaseProcess | None) -> bool:
    return process is not None and process.exitcode is None


def send_signal(process: BaseProcess | None, signum: signal.Signals) -> None:
    if process is not None and process.pid is not None and process.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


def describe(slot: Slot) -> str:
    pid = slot.process.pid if slot.process is not None else None
    return f"w{slot.index}.{slot.generation} (pid {pid})" if pid else f"w{slot.index}.{slot.generation}"


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
