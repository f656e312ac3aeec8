"""The runner supervisor: one pool of `n_runners` seats over a transport (local processes or Ray
actors, alight.runner.transport), and a thread that keeps the pool whole:

- a runner whose attempt runs past the rollout's timeout plus `kill_grace_s` (an agent stuck in C
  code, a blocked event loop), or that its transport finds stalled, is killed, its attempt
  recorded as timed out, and replaced at once;
- a runner that dies (a crash, SIGKILL, a lost node) has its attempt recorded as failed and is
  replaced after a backoff that doubles (up to `max_restart_backoff_s`) while its replacements keep
  dying without finishing an attempt, so a crash loop does not spin; once more than `max_restarts`
  runners of the pool have died, a dead runner is no longer replaced;
- `scale(n)` starts runners, or retires some: they drain and are not replaced;
- `stop(drain=True)` stops claiming, lets each runner finish its attempt within
  `drain_timeout_s`, then kills the rest and records their attempts as failed, to be retried.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Self

from alight.errors import ConfigError
from alight.runner.endings import Ending, record_end, runner_credential, store_counts
from alight.runner.slots import Held, PoolStats, Seat, kill_reason
from alight.runner.transport import Event, Transport
from alight.runner.worker import DRAIN_SIGNALS, WorkerSpec
from alight.serving.auth import runner_token
from alight.tracing.factory import TRACERS
from alight.types import AttemptStatus, new_id

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.config.schema import RunnerConfig
    from alight.store.client import StoreClient

logger = logging.getLogger(__name__)


class Supervisor:
    """`n_runners` runners of `agent` on rollouts from the store at `store_url`, started by
    `transport`; keeps the `Pool` protocol (alight.runner.base). `token` (default:
    ALIGHT_RUNNER_CREDENTIAL, else ALIGHT_TOKEN) is a runner credential, or the admin token with
    which the pool registers for one; agents get their attempt's own key, never either. `clock` is
    the time deadlines and backoffs are measured on.

    Each pool kind is a subclass registered by name in `alight.runner.factory.POOLS`
    (`runner.backend`) that states `runners_name`, `check_config` and `from_config`."""

    #: What the pool's runners are called where a person reads about them ("4 workers on ...").
    runners_name: ClassVar[str] = "runners"

    @classmethod
    def check_config(cls, cfg: RunnerConfig) -> None:
        """ConfigError, in one line, for `runner` settings this kind cannot start with; cheap (no
        heavy import) and free of effects. The checks every kind shares are `check_pool`'s."""
        return None

    @classmethod
    def from_config(cls, cfg: RunnerConfig, agent: str | LitAgent, store_url: str, **options: Any) -> Self:
        """The pool of this kind for the `runner` section, not started; `options` are the keyword
        arguments every pool takes (`PoolOptions`)."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a config")

    def __init__(
        self,
        transport: Transport,
        agent: str | LitAgent,
        store_url: str,
        *,
        n_runners: int = 4,
        tracer: str = "light",
        drain_timeout_s: float = 30.0,
        kill_grace_s: float = 2.0,
        poll_interval_s: float = 0.05,
        max_poll_interval_s: float = 0.5,
        heartbeat_interval_s: float = 2.0,
        restart_backoff_s: float = 0.5,
        max_restart_backoff_s: float = 30.0,
        max_restarts: int | None = None,
        start_timeout_s: float = 120.0,
        instrument: bool = True,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        if tracer not in TRACERS:
            raise ConfigError(f"unknown tracer {tracer!r} (choose from {', '.join(TRACERS)})")
        if not store_url.startswith(("http://", "https://")):
            raise ConfigError(f"bad store URL {store_url!r}: expected http://HOST:PORT")
        self.transport = transport
        self.agent = agent
        self.store_url = store_url.rstrip("/")
        self.n_runners = n_runners
        self.tracer = tracer
        self.drain_timeout_s = drain_timeout_s
        self.kill_grace_s = kill_grace_s
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.instrument = instrument  # False: the agent's LLM calls are not traced, runners start faster
        self.clock = clock
        # The admin token or a runner credential (never a log line); with the admin token, the
        # pool registers and its runners get a runner credential instead (`launch`).
        self._token = runner_token(token)
        self._runner_name: str | None = None
        self.pool_id = new_id("pool")[:13]
        self._seats = [Seat(i) for i in range(n_runners)]
        self._next_index = n_runners
        self._stats = PoolStats()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._stop_deadline: float | None = None  # set by stop(): kill what still runs past it
        self._fatal: str | None = None
        self._started = False  # start() has returned

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> Self:
        """Start the runners and the supervisor thread; return once every runner has loaded the
        agent. ConfigError (after stopping the pool) when they cannot load it."""
        if self._thread is not None:
            raise ConfigError("the runner pool is already started")
        self.launch()
        self._thread = threading.Thread(target=self._supervise, name=f"alight-{self.pool_id}", daemon=True)
        self._thread.start()
        atexit.register(self._stop_at_exit)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                fatal = next((seat.fatal for seat in self._seats if seat.fatal is not None), None)
                ready = all(seat.ready for seat in self._seats if not seat.retired)
            if fatal is not None:
                self.stop(drain=False)
                raise ConfigError(fatal)
            if ready:
                break
            time.sleep(0.02)
        else:
            name = self.transport.log_name
            logger.warning(
                "%s: not every %s was ready after %.0f s; going on", name, self.transport.noun, self.start_timeout_s
            )
        self._started = True
        return self

    def launch(self) -> None:
        """Open the transport and start a runner in every seat (`start` does this first; a test
        may call it and then `step` by hand, without the thread)."""
        if self._token is not None and self._runner_name is None:
            self._token, self._runner_name = runner_credential(self.store_url, self._token, self.pool_id)
        self.transport.open(self.n_runners)
        with self._lock:
            for seat in self._seats:
                if not seat.retired:
                    self._spawn(seat)

    def stop(self, drain: bool = True) -> None:
        """Stop the pool. Draining: runners stop claiming and finish their attempts within
        `drain_timeout_s`; then (or at once without draining) the rest are killed and their
        attempts recorded as failed. Returns once every runner has exited."""
        if self._thread is None:
            return
        with self._lock:
            now = self.clock()
            deadline = now + self.drain_timeout_s if drain else now
            self._stop_deadline = deadline if self._stop_deadline is None else min(self._stop_deadline, deadline)
            if drain:
                for seat in self._seats:
                    if seat.runner is not None:
                        seat.runner.drain()
        while not self._done.wait(0.2):  # an Event wait, not join(): a Ctrl-C may land here
            pass
        self._thread.join(1.0)
        atexit.unregister(self._stop_at_exit)
        self.transport.close()

    def scale(self, n_runners: int) -> None:
        """Keep `n_runners` runners: start new ones, or retire the newest (they finish the attempt
        they hold, then exit, and are not replaced)."""
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        with self._lock:
            active = [seat for seat in self._seats if not seat.retired]
            for _ in range(n_runners - len(active)):
                seat = Seat(self._next_index)
                self._next_index += 1
                self._seats.append(seat)
                if self._thread is not None and self._stop_deadline is None:
                    self._spawn(seat)
            for seat in active[n_runners:]:
                seat.retired, seat.restart_at = True, None
                if seat.runner is not None:
                    seat.runner.drain()
            self.n_runners = n_runners

    def _stop_at_exit(self) -> None:
        if not self._done.is_set():
            self.stop(drain=False)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=True)

    # -- what the trainer and the dashboard read --------------------------------------------
    def stats(self) -> PoolStats:
        with self._lock:
            n_alive = sum(1 for seat in self._seats if seat.alive)
            busy = sum(1 for seat in self._seats if seat.holding is not None)
            return replace(self._stats, workers_alive=n_alive, workers_busy=busy)

    @property
    def running(self) -> bool:
        """True while the pool has (or is about to replace) runners and was not told to stop."""
        with self._lock:
            if self._stop_deadline is not None or self._done.is_set():
                return False
            return any(seat.alive or seat.restart_at is not None for seat in self._seats)

    def wait_for_idle(self, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Wait until no runner holds an attempt and the store has no queuing or running rollout;
        False if `timeout_s` passed first. Raises ConfigError if every runner failed to start."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._fatal is not None and not self.running:
                raise ConfigError(self._fatal)
            if self.stats().workers_busy == 0:
                counts = store_counts(self.store_url, self._token)
                if counts.get("queuing", 0) == 0 and counts.get("running", 0) == 0 and self.stats().workers_busy == 0:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    # -- the supervisor thread --------------------------------------------------------------
    def _spawn(self, seat: Seat) -> None:
        """Start a runner in `seat` (lock held)."""
        seat.generation += 1
        worker = f"{self.pool_id}-w{seat.index}.{seat.generation}"
        spec = WorkerSpec(
            agent=self.agent,
            store_url=self.store_url,
            tracer=self.tracer,
            worker_id=f"{self._runner_name}/{worker}" if self._runner_name is not None else worker,
            poll_interval_s=self.poll_interval_s,
            max_poll_interval_s=self.max_poll_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            log_level=logging.getLogger().getEffectiveLevel(),
            instrument=self.instrument,
            token=self._token,
        )
        seat.runner = self.transport.spawn(spec)
        seat.holding, seat.ready, seat.restart_at, seat.kill_reason = None, False, None, None
        self._stats = self._stats.plus("workers_started")

    def _supervise(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, DRAIN_SIGNALS)  # the main thread handles Ctrl-C
        loop = asyncio.new_event_loop()
        store: StoreClient | None = None
        try:
            while True:
                with self._lock:
                    runners = [seat.runner for seat in self._seats if seat.runner is not None]
                self.transport.wait(runners, 0.1)
                with self._lock:
                    endings = self.step()
                    finished = self._stop_deadline is not None and not any(seat.runner for seat in self._seats)
                for attempt_id, status, error in endings:
                    if store is None:
                        from alight.store.client import StoreClient

                        store = StoreClient(self.store_url, token=self._token)
                    loop.run_until_complete(record_end(store, attempt_id, status, error))
                if finished:
                    return
        except Exception:
            logger.exception("%s: the supervisor failed; killing every runner", self.transport.log_name)
            for seat in self._seats:
                if seat.runner is not None:
                    seat.runner.kill()
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(store.close())
            loop.close()
            self._done.set()

    def step(self) -> list[Ending]:
        """One supervision step (the thread holds the lock): read what the runners reported, book
        their exits, enforce deadlines, restart runners whose backoff is over. Returns the
        attempts to record as ended in the store."""
        now = self.clock()
        endings: list[Ending] = []
        for seat in self._seats:
            if seat.runner is None:
                if seat.restart_at is not None and now >= seat.restart_at and self._stop_deadline is None:
                    self._spawn(seat)
                    self._stats = self._stats.plus("workers_restarted")
                continue
            for event in seat.runner.poll(now):
                endings.extend(self._on_event(seat, event, now))
            if seat.runner is not None:
                self._enforce_deadlines(seat, now)
        self._seats = [seat for seat in self._seats if not (seat.retired and seat.runner is None)]
        return endings

    def _on_event(self, seat: Seat, event: Event, now: float) -> list[Ending]:
        kind = event[0]
        if kind == "ready":
            seat.ready = True
            if (self._stop_deadline is not None or seat.retired) and seat.runner is not None:
                seat.runner.drain()  # told to drain while it was starting
        elif kind == "fatal":
            seat.fatal = str(event[1])
        elif kind == "claim":
            _, attempt_id, rollout_id, timeout_s = event
            deadline = None if timeout_s is None else now + timeout_s + self.kill_grace_s
            seat.holding = Held(attempt_id, rollout_id, timeout_s, deadline)
        elif kind == "done":
            _, attempt_id, status = event
            if seat.holding is not None and seat.holding.attempt_id == attempt_id:
                seat.holding = None
            seat.crashes = 0
            self._stats = self._stats.plus_attempt(None if status is None else AttemptStatus(status))
        elif kind == "exit":
            return self._on_exit(seat, str(event[1]), str(event[2]), now)
        return []

    def _enforce_deadlines(self, seat: Seat, now: float) -> None:
        if seat.kill_reason is not None or seat.runner is None:
            return
        stalled = seat.runner.stalled(now)
        seat.kill_reason = kill_reason(seat.holding, stalled, now, self.kill_grace_s, self._stop_deadline)
        if seat.kill_reason is None:
            return
        logger.warning("%s: killing %s: %s", self.transport.log_name, seat.runner.name, seat.kill_reason[1])
        seat.runner.kill()

    def _on_exit(self, seat: Seat, how: str, detail: str, now: float) -> list[Ending]:
        """Book a runner's exit, schedule its replacement; the attempt it held, to record."""
        name = seat.runner.name if seat.runner is not None else f"#{seat.index}"
        noun, log_name = self.transport.noun, self.transport.log_name
        held = seat.holding
        replace_in: float | None = None
        if seat.kill_reason is not None:
            status, error = seat.kill_reason
            self._stats = self._stats.plus("workers_killed")
            replace_in = 0.0
        elif how == "fatal":
            status, error = AttemptStatus.FAILED, seat.fatal or f"the {noun} could not start"
            self._fatal = error
            if self._started:  # during start() the error is raised to the caller instead
                logger.error("%s: %s %s cannot start: %s", log_name, noun, name, error)
        elif how == "drained":  # it was asked to stop (by stop(), scale(), or a Ctrl-C to the process group)
            status, error = AttemptStatus.FAILED, f"the {noun} stopped before the attempt finished"
        elif how == "recycle":
            status, error = AttemptStatus.TIMEOUT, "the agent's thread was stuck past its timeout"
            replace_in = 0.0
        else:
            status, error = AttemptStatus.FAILED, f"{noun} died ({detail})"
            self._stats = self._stats.plus("workers_died")
            seat.crashes += 1
            replace_in = self.backoff(seat.crashes)
            if self.max_restarts is not None and self._stats.workers_died > self.max_restarts:
                logger.error("%s: more than %d runners died; not replacing %s", log_name, self.max_restarts, name)
                replace_in = None
            else:
                logger.warning("%s: %s, %s; replacing it in %.1f s", log_name, error, name, replace_in)
        seat.runner, seat.holding = None, None
        if replace_in is not None and self._stop_deadline is None and not seat.retired:
            seat.restart_at = now + replace_in
        if held is None:
            return []
        self._stats = self._stats.plus_attempt(status)
        return [(held.attempt_id, status, error)]

    def backoff(self, crashes: int) -> float:
        """Seconds before replacing a runner that died after `crashes` deaths in a row in its seat."""
        return float(min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (crashes - 1)))
