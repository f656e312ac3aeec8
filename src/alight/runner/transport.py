"""The runner transport seam: how the supervisor (alight.runner.supervisor) starts, watches and
stops one runner, whatever it runs in (a local process: alight.runner.pool; a Ray actor:
alight.runner.ray_pool).

A runner reports what happens to it as events, small tuples read by `RunnerHandle.poll`:

    ("ready",)                                  it loaded the agent and claims rollouts
    ("fatal", message)                          it cannot load the agent (restarting will not help)
    ("claim", attempt_id, rollout_id, timeout_s)
    ("done", attempt_id, status)                status: an AttemptStatus value, None if ended elsewhere
    ("exit", how, detail)                       its last event; `how` is one of EXIT_KINDS

The supervisor owns every decision (deadlines, kill grace, restarts, backoff, drain, counts); a
transport only carries the runner's words and the supervisor's signals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from alight.runner.worker import WorkerSpec

Event = tuple[Any, ...]

#: How a runner ended: asked to stop and did; its agent's thread was stuck past the attempt's
#: timeout (replace it); it could not load the agent; it died unasked (`detail` says how).
EXIT_KINDS = ("drained", "recycle", "fatal", "died")


class RunnerHandle(Protocol):
    """One started runner, as its transport holds it."""

    @property
    def name(self) -> str:
        """Which runner, in log lines."""
        ...

    @property
    def alive(self) -> bool:
        """True until the runner is known to have exited."""
        ...

    def poll(self, now: float) -> list[Event]:
        """What the runner reported since the last call, without blocking; an "exit" event last,
        once it has ended (its resources are released by then)."""
        ...

    def stalled(self, now: float) -> str | None:
        """Why the runner must be killed although its attempt's deadline is not past (it cannot
        answer), or None."""
        ...

    def drain(self) -> None:
        """Ask it to stop claiming and end after the attempt in hand."""
        ...

    def kill(self) -> None:
        """End it now; its "exit" event follows."""
        ...


class Transport(Protocol):
    """Starts runners of one kind for a pool."""

    noun: str  # what a runner is called in attempt errors: "worker", "runner actor"
    log_name: str  # the pool in log lines: "runner pool", "ray runner pool"

    def open(self, n_runners: int) -> None:
        """Before the first runner starts (join a cluster, check it can hold `n_runners`)."""
        ...

    def spawn(self, spec: WorkerSpec) -> RunnerHandle:
        """Start one runner (it reports "ready" or "fatal" once it has loaded the agent)."""
        ...

    def wait(self, runners: list[RunnerHandle], timeout_s: float) -> None:
        """Block until one of `runners` may have news, or `timeout_s` passed."""
        ...

    def close(self) -> None:
        """After the last runner is gone."""
        ...
