"""The Ray runner pool (`runner.backend: ray`): runners as Ray actors, on one machine or a cluster.

Each actor (`RunnerActor`) runs today's `Runner` with its own `StoreClient` over HTTP, on the
actor's event loop, and reports what it holds to the pool through a long poll (`next_events`).
A supervisor thread on the driver keeps the pool whole, as the local pool's does:

- an actor that dies (its node is lost, the OOM killer, `ray.kill`, a crash) has the attempt it
  held recorded as failed in the store, so the rollout is retried up to `max_attempts`, and is
  replaced after a backoff that grows while its replacements keep dying;
- an actor whose attempt runs past the rollout's timeout plus `kill_grace_s` is killed, its
  attempt recorded as timed out, and replaced;
- `stop(drain=True)` (the trainer's stop, Ctrl-C in `alight runner`) tells every actor to stop
  claiming and finish its attempt within `drain_timeout_s`; the rest are killed and their
  attempts recorded as failed, to be retried.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.config.schema import RayConfig
from alight.errors import ConfigError
from alight.runner.pool import TRACERS, record_end, store_counts
from alight.runner.ray_actor import EVENT_POLL_S, RunnerActor
from alight.runner.ray_cluster import actor_options, check_capacity, connect
from alight.runner.slots import Held, PoolStats
from alight.runner.worker import WorkerSpec
from alight.serving.auth import resolve_token
from alight.types import AttemptStatus, new_id

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.store.client import StoreClient

logger = logging.getLogger(__name__)


@dataclass
class _Seat:
    """One place in the Ray pool: its current actor (replaced as actors die) and its state."""

    index: int
    generation: int = 0
    actor: Any = None
    name: str = ""
    ready_ref: Any = None
    run_ref: Any = None
    events_ref: Any = None
    seen: int = 0  # events read so far
    holding: Held | None = None
    ready: bool = False
    fatal: str | None = None
    crashes: int = 0
    restart_at: float | None = None
    kill_reason: tuple[AttemptStatus, str] | None = None
    retired: bool = False
    events_asked_at: float = 0.0  # when the long poll now pending was sent


class RayRunnerPool:
    """`n_runners` Ray actors running `agent` on rollouts from the store at `store_url`.

    `ray` (a `RayConfig`) says which cluster to join (`address`; None starts a local one unless
    Ray is already initialised in this process) and what each actor reserves (`num_cpus`,
    `resources`, `label_selector`, `spread`). `agent` is an entrypoint (a file path is made
    absolute, so actors on this machine find it; on other nodes use a module or the same path) or
    a `LitAgent` Ray can pickle. The other arguments mean what they mean for `RunnerPool`."""

    def __init__(
        self,
        agent: str | LitAgent,
        store_url: str,
        *,
        n_runners: int = 4,
        tracer: str = "light",
        drain_timeout_s: float = 30.0,
        kill_grace_s: float = 2.0,
        unresponsive_s: float = 60.0,
        poll_interval_s: float = 0.05,
        max_poll_interval_s: float = 0.5,
        heartbeat_interval_s: float = 2.0,
        restart_backoff_s: float = 0.5,
        max_restart_backoff_s: float = 30.0,
        max_restarts: int | None = None,
        start_timeout_s: float = 120.0,
        instrument: bool = True,
        token: str | None = None,
        ray: RayConfig | None = None,
    ) -> None:
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        if tracer not in TRACERS:
            raise ConfigError(f"unknown tracer {tracer!r} (choose from {', '.join(TRACERS)})")
        if not store_url.startswith(("http://", "https://")):
            raise ConfigError(f"bad store URL {store_url!r}: expected http://HOST:PORT")
        self.agent = _absolute_entrypoint(agent) if isinstance(agent, str) else agent
        self.store_url = store_url.rstrip("/")
        self.n_runners = n_runners
        self.tracer = tracer
        self.drain_timeout_s = drain_timeout_s
        self.kill_grace_s = kill_grace_s
        # An actor whose long poll stays unanswered this long past EVENT_POLL_S has its event loop
        # blocked (by an agent): it can neither heartbeat nor report, so it is killed and replaced.
        self.unresponsive_s = unresponsive_s
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.instrument = instrument
        self.ray_config = ray or RayConfig()
        self._token = resolve_token(token)
        self.pool_id = new_id("pool")[:13]
        self._seats = [_Seat(i) for i in range(n_runners)]
        self._next_index = n_runners
        self._stats = PoolStats()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._stop_deadline: float | None = None
        self._fatal: str | None = None
        self._started = False
        self._owns_ray = False  # this pool started (or joined) Ray, so it shuts Ray down at stop
        self._actor_class: Any = None
        self.dashboard_url: str | None = None  # the Ray dashboard, when this pool started Ray

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> RayRunnerPool:
        """Join (or start) Ray, start the actors and the supervisor; return once every actor has
        loaded the agent. ConfigError (after stopping the pool) when they cannot load it, or when
        no node of the cluster could ever hold one actor."""
        if self._thread is not None:
            raise ConfigError("the runner pool is already started")
        ray, self._owns_ray, self.dashboard_url = connect(self.ray_config)
        check_capacity(ray, self.ray_config, self.n_runners)
        self._actor_class = ray.remote(**actor_options(self.ray_config))(RunnerActor)
        with self._lock:
            for seat in self._seats:
                if not seat.retired:
                    self._spawn(seat)
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
            logger.warning(
                "ray runner pool: not every actor was ready after %.0f s (waiting for cluster resources?); going on",
                self.start_timeout_s,
            )
        self._started = True
        return self

    def stop(self, drain: bool = True) -> None:
        """Stop the pool. Draining: actors stop claiming and finish their attempts within
        `drain_timeout_s`; then (or at once without draining) the rest are killed and their
        attempts recorded as failed. Returns once every actor is gone."""
        if self._thread is None:
            return
        with self._lock:
            now = time.monotonic()
            deadline = now + self.drain_timeout_s if drain else now
            self._stop_deadline = deadline if self._stop_deadline is None else min(self._stop_deadline, deadline)
            if drain:
                for seat in self._seats:
                    self._drain(seat)
        while not self._done.wait(0.2):  # an Event wait, not join(): a Ctrl-C may land here
            pass
        self._thread.join(1.0)
        atexit.unregister(self._stop_at_exit)
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    def scale(self, n_runners: int) -> None:
        """Keep `n_runners` actors: start new ones, or retire the newest (they finish the attempt
        they hold, then exit, and are not replaced)."""
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        with self._lock:
            active = [seat for seat in self._seats if not seat.retired]
            for _ in range(n_runners - len(active)):
                seat = _Seat(self._next_index)
                self._next_index += 1
                self._seats.append(seat)
                if self._thread is not None and self._stop_deadline is None:
                    self._spawn(seat)
            for seat in active[n_runners:]:
                seat.retired, seat.restart_at = True, None
                self._drain(seat)
            self.n_runners = n_runners

    def _stop_at_exit(self) -> None:
        if not self._done.is_set():
            self.stop(drain=False)

    def __enter__(self) -> RayRunnerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=True)

    # -- what the trainer and the dashboard read --------------------------------------------
    def stats(self) -> PoolStats:
        with self._lock:
            n_alive = sum(1 for seat in self._seats if seat.actor is not None)
            busy = sum(1 for seat in self._seats if seat.holding is not None)
            return replace(self._stats, workers_alive=n_alive, workers_busy=busy)

    @property
    def running(self) -> bool:
        """True while the pool has (or is about to replace) actors and was not told to stop."""
        with self._lock:
            if self._stop_deadline is not None or self._done.is_set():
                return False
            return any(seat.actor is not None or seat.restart_at is not None for seat in self._seats)

    def wait_for_idle(self, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Wait until no actor holds an attempt and the store has no queuing or running rollout;
        False if `timeout_s` passed first. Raises ConfigError if every actor failed to start."""
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

    # -- the supervisor ---------------------------------------------------------------------
    def _spawn(self, seat: _Seat) -> None:
        """Start an actor in `seat` (lock held)."""
        seat.generation += 1
        seat.name = f"alight-{self.pool_id}-w{seat.index}.{seat.generation}"
        spec = WorkerSpec(
            agent=self.agent,
            store_url=self.store_url,
            tracer=self.tracer,
            worker_id=seat.name.removeprefix("alight-"),
            poll_interval_s=self.poll_interval_s,
            max_poll_interval_s=self.max_poll_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            log_level=logging.getLogger().getEffectiveLevel(),
            instrument=self.instrument,
            token=self._token,
        )
        seat.actor = self._actor_class.options(name=seat.name).remote(spec)
        seat.ready_ref = seat.actor.ready.remote()
        seat.run_ref = seat.events_ref = None
        seat.seen = 0
        seat.holding, seat.ready, seat.restart_at, seat.kill_reason = None, False, None, None
        self._stats = replace(self._stats, workers_started=self._stats.workers_started + 1)

    def _drain(self, seat: _Seat) -> None:
        if seat.actor is not None:
            with contextlib.suppress(Exception):
                seat.actor.drain.remote()

    def _supervise(self) -> None:
        import ray

        loop = asyncio.new_event_loop()
        store: StoreClient | None = None
        try:
            while True:
                with self._lock:
                    waiting = {ref: seat for seat in self._seats for ref in _refs(seat)}
                if waiting:
                    refs = list(waiting)
                    ray.wait(refs, num_returns=1, timeout=0.1)
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                else:
                    time.sleep(0.1)
                    ready = []
                with self._lock:
                    endings = self._tend(ray, ready, waiting)
                    finished = self._stop_deadline is not None and not any(seat.actor for seat in self._seats)
                for attempt_id, status, error in endings:
                    if store is None:
                        from alight.store.client import StoreClient

                        store = StoreClient(self.store_url, token=self._token)
                    loop.run_until_complete(record_end(store, attempt_id, status, error))
                if finished:
                    return
        except Exception:
            logger.exception("ray runner pool: the supervisor failed; killing every actor")
            for seat in self._seats:
                _kill(seat.actor)
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(store.close())
            loop.close()
            self._done.set()

    def _tend(self, ray: Any, ready: list[Any], waiting: dict[Any, _Seat]) -> list[tuple[str, AttemptStatus, str]]:
        """One supervision step (lock held): read what the actors answered, enforce deadlines,
        book exits and deaths, restart actors. Returns the attempts to record as ended."""
        now = time.monotonic()
        endings: list[tuple[str, AttemptStatus, str]] = []
        # Events first: an actor's last "done" must be read before its exit is booked.
        for ref in sorted(ready, key=lambda r: 0 if r == waiting[r].events_ref else 1):
            seat = waiting[ref]
            if seat.actor is None or ref not in _refs(seat):
                continue
            try:
                answer = ray.get(ref, timeout=0)
            except Exception as err:  # the actor is gone: RayActorError, OutOfMemoryError, a node lost
                endings.extend(self._exit(seat, None, err, now))
                continue
            if ref == seat.events_ref:
                self._on_events(seat, answer)
                seat.events_ref = seat.actor.next_events.remote(seat.seen)
                seat.events_asked_at = now
            elif ref == seat.ready_ref:
                seat.ready_ref = None
                if answer is not None:
                    seat.fatal = str(answer)
                    endings.extend(self._exit(seat, "fatal", None, now))
                    continue
                seat.ready = True
                seat.run_ref = seat.actor.run.remote()
                seat.events_ref = seat.actor.next_events.remote(0)
                seat.events_asked_at = now
                if self._stop_deadline is not None or seat.retired:
                    self._drain(seat)
            elif ref == seat.run_ref:
                with contextlib.suppress(Exception):  # its last events, if the long poll has not brought them
                    self._on_events(seat, ray.get(seat.actor.next_events.remote(seat.seen, 0.0), timeout=10))
                endings.extend(self._exit(seat, str(answer), None, now))
        for seat in self._seats:
            if seat.actor is None:
                if seat.restart_at is not None and now >= seat.restart_at and self._stop_deadline is None:
                    self._spawn(seat)
                    self._count("workers_restarted")
            else:
                self._enforce_deadlines(seat, now)
        self._seats = [seat for seat in self._seats if not (seat.retired and seat.actor is None)]
        return endings

    def _on_events(self, seat: _Seat, events: list[tuple[Any, ...]]) -> None:
        for event in events:
            kind = event[0]
            if kind == "claim":
                _, attempt_id, rollout_id, timeout_s = event
                deadline = None if timeout_s is None else time.monotonic() + timeout_s + self.kill_grace_s
                seat.holding = Held(attempt_id, rollout_id, timeout_s, deadline)
            elif kind == "done":
                _, attempt_id, status = event
                if seat.holding is not None and seat.holding.attempt_id == attempt_id:
                    seat.holding = None
                seat.crashes = 0
                self._count_attempt(None if status is None else AttemptStatus(status))
        seat.seen += len(events)

    def _enforce_deadlines(self, seat: _Seat, now: float) -> None:
        if seat.kill_reason is not None:
            return
        held = seat.holding
        if held is not None and held.deadline is not None and now > held.deadline:
            reason = (
                f"killed by the runner pool: the attempt ran past its timeout of {held.timeout_s:g} s "
                f"(+{self.kill_grace_s:g} s grace) and the agent did not stop"
            )
            seat.kill_reason = (AttemptStatus.TIMEOUT, reason)
        elif seat.events_ref is not None and now - seat.events_asked_at > EVENT_POLL_S + self.unresponsive_s:
            silent = now - seat.events_asked_at
            reason = (
                f"killed by the runner pool: the actor answered nothing for {silent:.0f} s (its event loop is blocked)"
            )
            seat.kill_reason = (AttemptStatus.TIMEOUT, reason)
        elif self._stop_deadline is not None and now >= self._stop_deadline:
            seat.kill_reason = (AttemptStatus.FAILED, "the runner pool stopped before the attempt finished")
        else:
            return
        logger.warning("ray runner pool: killing actor %s: %s", seat.name, seat.kill_reason[1])
        _kill(seat.actor)

    def _exit(
        self, seat: _Seat, how: str | None, err: BaseException | None, now: float
    ) -> list[tuple[str, AttemptStatus, str]]:
        """Book an actor's end (`how`: "drained", "recycle", "fatal"; None: it died of `err`),
        schedule its replacement; the attempt it held, to record."""
        held = seat.holding
        replace_in: float | None = None
        if seat.kill_reason is not None:
            status, error = seat.kill_reason
            self._count("workers_killed")
            replace_in = 0.0
        elif how == "fatal":
            status, error = AttemptStatus.FAILED, seat.fatal or "the runner actor could not start"
            self._fatal = error
            if self._started:
                logger.error("ray runner pool: actor %s cannot start: %s", seat.name, error)
        elif how == "drained":
            status, error = AttemptStatus.FAILED, "the runner stopped before the attempt finished"
        elif how == "recycle":
            status, error = AttemptStatus.TIMEOUT, "the agent's thread was stuck past its timeout"
            replace_in = 0.0
        else:
            status, error = AttemptStatus.FAILED, f"runner actor died ({_death_text(err)})"
            self._count("workers_died")
            seat.crashes += 1
            replace_in = min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (seat.crashes - 1))
            if self.max_restarts is not None and self._stats.workers_died > self.max_restarts:
                limit = self.max_restarts
                logger.error("ray runner pool: more than %d actors died; not replacing %s", limit, seat.name)
                replace_in = None
            else:
                logger.warning("ray runner pool: %s, %s; replacing it in %.1f s", error, seat.name, replace_in)
        _kill(seat.actor)  # a drained actor's process goes, and its CPUs go back to the cluster
        seat.actor = seat.ready_ref = seat.run_ref = seat.events_ref = None
        seat.holding = None
        if replace_in is not None and self._stop_deadline is None and not seat.retired:
            seat.restart_at = now + replace_in
        if held is None:
            return []
        self._count_attempt(status)
        return [(held.attempt_id, status, error)]

    def _count(self, field: str) -> None:
        self._stats = replace(self._stats, **{field: getattr(self._stats, field) + 1})

    def _count_attempt(self, status: AttemptStatus | None) -> None:
        field = {
            AttemptStatus.SUCCEEDED: "attempts_succeeded",
            AttemptStatus.TIMEOUT: "attempts_timed_out",
            None: "attempts_ended_elsewhere",
        }.get(status, "attempts_failed")
        self._count(field)


def _refs(seat: _Seat) -> list[Any]:
    return [ref for ref in (seat.ready_ref, seat.events_ref, seat.run_ref) if ref is not None]


def _kill(actor: Any) -> None:
    if actor is not None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def _death_text(err: BaseException | None) -> str:
    """One line on why an actor died, from Ray's (long) error."""
    if err is None:
        return "unknown cause"
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__


def _absolute_entrypoint(agent: str) -> str:
    """`path/to/file.py:name` with the path made absolute when the file is here; others as given."""
    path, sep, name = agent.rpartition(":")
    if sep and path.endswith(".py") and Path(path).is_file():
        return f"{Path(path).resolve()}:{name}"
    return agent
