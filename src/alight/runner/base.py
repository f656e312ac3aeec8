"""The runner-pool seam: what the trainer, `alight runner` and the dashboard need from a pool.

A pool runs `n_runners` runners of one agent against a store server's URL, keeps that many alive
(a runner that dies has its attempt recorded as failed, to be retried, and is replaced), and
stops by draining: runners stop claiming and finish their attempts within a timeout. Both pools
are the one runner supervisor (`alight.runner.supervisor.Supervisor`) over a transport: the local
pool (`alight.runner.pool.RunnerPool`) runs worker processes, the Ray pool
(`alight.runner.ray_pool.RayRunnerPool`) Ray actors; `alight.runner.factory.make_pool` picks one.
"""

from __future__ import annotations

from typing import Protocol, TypedDict, runtime_checkable

from alight.runner.slots import PoolStats


@runtime_checkable
class Pool(Protocol):
    """A pool of runners; `with make_pool(...) as pool:` starts and drains it."""

    n_runners: int  # the runners the pool keeps alive (changed by `scale`)
    store_url: str  # the store server the runners work for

    def start(self) -> Pool:
        """Start `n_runners` runners; return once each has loaded the agent. ConfigError (after
        stopping the pool) when they cannot load it."""
        ...

    def scale(self, n_runners: int) -> None:
        """Keep `n_runners` runners from now on: new ones start, surplus ones drain and exit."""
        ...

    def stop(self, drain: bool = True) -> None:
        """Stop claiming; with `drain`, runners finish their attempts within the pool's drain
        timeout. Attempts still running afterwards are recorded as failed (to be retried).
        Returns once every runner is gone; a second call is a no-op."""
        ...

    @property
    def running(self) -> bool:
        """True while the pool has (or is about to replace) runners and was not told to stop."""
        ...

    def stats(self) -> PoolStats:
        """Counts since the start: attempts by outcome, runners started, replaced, died, killed."""
        ...

    def wait_for_idle(self, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Wait until no runner holds an attempt and the store has nothing queuing or running;
        False if `timeout_s` passed first."""
        ...

    def __enter__(self) -> Pool: ...

    def __exit__(self, *exc: object) -> None: ...


class PoolOptions(TypedDict, total=False):
    """The keyword arguments both pools take (`RunnerPool(..., **options)`); see `Supervisor`."""

    n_runners: int
    tracer: str
    drain_timeout_s: float
    kill_grace_s: float
    poll_interval_s: float
    max_poll_interval_s: float
    heartbeat_interval_s: float
    restart_backoff_s: float
    max_restart_backoff_s: float
    max_restarts: int | None
    start_timeout_s: float
    instrument: bool
    token: str | None
