"""The local runner pool: `n_runners` worker processes and a supervisor thread.

Workers (alight.runner.worker) each run a `Runner` against the store's HTTP URL and tell the
supervisor which attempt they hold. The supervisor keeps the pool whole:

- a worker whose attempt runs past the rollout's timeout plus `kill_grace_s` (an agent stuck in
  C code, a blocked event loop) is killed, its attempt recorded as timed out, and replaced;
- a worker that dies (a crash, SIGKILL, `os._exit`) has its attempt recorded as failed and is
  replaced after a backoff that grows while its replacements keep dying without finishing an
  attempt, so a crash loop does not spin;
- `scale(n)` starts workers, or retires some: they drain and are not replaced;
- `stop(drain=True)` (and Ctrl-C, which reaches every worker of the terminal's process group)
  stops claiming, lets each worker finish its attempt within `drain_timeout_s`, then kills the
  rest and records their attempts as failed, so they are retried rather than lost.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import multiprocessing as mp
import pickle
import signal
import threading
import time
import urllib.request
from dataclasses import replace
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from alight.errors import AlightError, ConfigError, InvalidTransitionError, NotFoundError
from alight.runner.slots import Held, PoolStats, Slot, alive, describe, exit_text, send_signal
from alight.runner.worker import DRAIN_SIGNALS, EXIT_CONFIG, EXIT_DRAINED, EXIT_RECYCLE, WorkerSpec, worker_main
from alight.serving.auth import bearer_header, resolve_token
from alight.types import AttemptStatus, new_id

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.store.client import StoreClient

logger = logging.getLogger(__name__)

TRACERS = ("light", "otel")


class RunnerPool:
    """`n_runners` worker processes running `agent` on rollouts from the store at `store_url`.

    `agent` is an entrypoint (`module:name` or `file.py:name`), loaded in each worker, or a
    picklable `LitAgent`. Use `start()`/`stop()` or `with RunnerPool(...) as pool:`. `token`
    (default: `ALIGHT_TOKEN`) reaches the store; workers scope their writes to their own attempts
    and hand it to agents as the LLM `api_key` (the proxy's bearer token)."""

    def __init__(
        self,
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
    ) -> None:
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        if tracer not in TRACERS:
            raise ConfigError(f"unknown tracer {tracer!r} (choose from {', '.join(TRACERS)})")
        if not store_url.startswith(("http://", "https://")):
            raise ConfigError(f"bad store URL {store_url!r}: expected http://HOST:PORT")
        if not isinstance(agent, str):
            try:
                pickle.dumps(agent)
            except Exception as err:
                raise ConfigError(
                    f"agent {getattr(agent, 'name', agent)!r} cannot be sent to worker processes "
                    f"({type(err).__name__}); pass its entrypoint 'module:name' instead"
                ) from None
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
        self.instrument = instrument  # False: the agent's LLM calls are not traced, workers start faster
        self._token = resolve_token(token)  # default: ALIGHT_TOKEN; workers get it, never a log line
        self.pool_id = new_id("pool")[:13]
        self._slots = [Slot(i) for i in range(n_runners)]
        self._next_index = n_runners
        self._stats = PoolStats()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._stop_deadline: float | None = None  # set by stop(): kill what still runs past it
        self._fatal: str | None = None
        self._started = False  # start() has returned

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> RunnerPool:
        """Start the workers and the supervisor; return once every worker has loaded the agent.
        Raises ConfigError (after stopping the pool) when a worker cannot load it."""
        if self._thread is not None:
            raise ConfigError("the runner pool is already started")
        with self._lock:
            for slot in self._slots:
                if not slot.retired:
                    self._spawn(slot)
        self._thread = threading.Thread(target=self._supervise, name=f"alight-{self.pool_id}", daemon=True)
        self._thread.start()
        atexit.register(self._stop_at_exit)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                fatal = next((slot.fatal for slot in self._slots if slot.fatal is not None), None)
                ready = all(slot.ready for slot in self._slots)
            if fatal is not None:
                self.stop(drain=False)
                raise ConfigError(fatal)
            if ready:
                break
            time.sleep(0.02)
        else:
            logger.warning("runner pool: not every worker was ready after %.0f s; going on", self.start_timeout_s)
        self._started = True
        return self

    def stop(self, drain: bool = True) -> None:
        """Stop the pool. Draining: workers stop claiming and finish their attempts within
        `drain_timeout_s`; then (or at once without draining) the rest are killed and their
        attempts recorded as failed. Returns once every worker has exited."""
        if self._thread is None:
            return
        with self._lock:
            now = time.monotonic()
            deadline = now + self.drain_timeout_s if drain else now
            self._stop_deadline = deadline if self._stop_deadline is None else min(self._stop_deadline, deadline)
            if drain:
                for slot in self._slots:
                    send_signal(slot.process, signal.SIGTERM)
        while not self._done.wait(0.2):  # an Event wait, not join(): a Ctrl-C may land here
            pass
        self._thread.join(1.0)
        atexit.unregister(self._stop_at_exit)

    def scale(self, n_runners: int) -> None:
        """Keep `n_runners` workers: start new ones, or retire the newest (they finish the attempt
        they hold, then exit, and are not replaced)."""
        if n_runners < 1:
            raise ConfigError(f"n_runners must be at least 1, got {n_runners}")
        with self._lock:
            active = [slot for slot in self._slots if not slot.retired]
            for _ in range(n_runners - len(active)):
                slot = Slot(self._next_index)
                self._next_index += 1
                self._slots.append(slot)
                if self._thread is not None and self._stop_deadline is None:
                    self._spawn(slot)
            for slot in active[n_runners:]:
                slot.retired, slot.restart_at = True, None
                send_signal(slot.process, signal.SIGTERM)
            self.n_runners = n_runners

    def _stop_at_exit(self) -> None:
        if not self._done.is_set():
            self.stop(drain=False)

    def __enter__(self) -> RunnerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=True)

    # -- what the trainer and the dashboard read --------------------------------------------
    def stats(self) -> PoolStats:
        with self._lock:
            n_alive = sum(1 for slot in self._slots if alive(slot.process))
            busy = sum(1 for slot in self._slots if slot.holding is not None)
            return replace(self._stats, workers_alive=n_alive, workers_busy=busy)

    @property
    def running(self) -> bool:
        """True while the pool has (or is about to restart) workers and was not told to stop."""
        with self._lock:
            if self._stop_deadline is not None or self._done.is_set():
                return False
            return any(alive(slot.process) or slot.restart_at is not None for slot in self._slots)

    def wait_for_idle(self, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Wait until no worker holds an attempt and the store has no queuing or running rollout;
        False if `timeout_s` passed first. Raises ConfigError if every worker failed to start."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._fatal is not None and not self.running:
                raise ConfigError(self._fatal)
            if self.stats().workers_busy == 0:
                counts = self._store_counts()
                if counts.get("queuing", 0) == 0 and counts.get("running", 0) == 0 and self.stats().workers_busy == 0:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def _store_counts(self) -> dict[str, int]:
        return store_counts(self.store_url, self._token)

    # -- the supervisor ---------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        """Start a worker in `slot` (lock held)."""
        ctx = mp.get_context("spawn")
        receiver, sender = ctx.Pipe(duplex=False)
        slot.generation += 1
        spec = WorkerSpec(
            agent=self.agent,
            store_url=self.store_url,
            tracer=self.tracer,
            worker_id=f"{self.pool_id}-w{slot.index}.{slot.generation}",
            poll_interval_s=self.poll_interval_s,
            max_poll_interval_s=self.max_poll_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            log_level=logging.getLogger().getEffectiveLevel(),
            instrument=self.instrument,
            token=self._token,
        )
        process = ctx.Process(target=worker_main, args=(spec, sender), name=spec.worker_id)
        # Blocked signals are inherited: a Ctrl-C during the worker's start-up waits for its handlers.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, DRAIN_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        sender.close()
        slot.process, slot.conn = process, receiver
        slot.holding, slot.ready, slot.restart_at, slot.kill_reason = None, False, None, None
        self._stats = replace(self._stats, workers_started=self._stats.workers_started + 1)

    def _supervise(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, DRAIN_SIGNALS)  # the main thread handles Ctrl-C
        loop = asyncio.new_event_loop()
        store: StoreClient | None = None
        try:
            while True:
                with self._lock:
                    waitables: list[Any] = [slot.conn for slot in self._slots if slot.conn is not None]
                    waitables += [slot.process.sentinel for slot in self._slots if slot.process is not None]
                wait(waitables, timeout=0.1) if waitables else time.sleep(0.1)
                with self._lock:
                    endings = self._tend()
                    finished = self._stop_deadline is not None and not any(slot.process for slot in self._slots)
                for attempt_id, status, error in endings:
                    if store is None:
                        from alight.store.client import StoreClient

                        store = StoreClient(self.store_url, token=self._token)
                    loop.run_until_complete(record_end(store, attempt_id, status, error))
                if finished:
                    return
        except Exception:
            logger.exception("runner pool: the supervisor failed; stopping every worker")
            for slot in self._slots:
                send_signal(slot.process, signal.SIGKILL)
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(store.close())
            loop.close()
            self._done.set()

    def _tend(self) -> list[tuple[str, AttemptStatus, str]]:
        """One supervision step (lock held): read messages, enforce deadlines, reap and restart
        workers. Returns the attempts to record as ended in the store."""
        now = time.monotonic()
        endings: list[tuple[str, AttemptStatus, str]] = []
        for slot in self._slots:
            self._read(slot)
            process = slot.process
            if process is None:
                if slot.restart_at is not None and now >= slot.restart_at and self._stop_deadline is None:
                    self._spawn(slot)
                    self._stats = replace(self._stats, workers_restarted=self._stats.workers_restarted + 1)
                continue
            if process.exitcode is None:
                self._enforce_deadlines(slot, now)
                continue
            process.join(0)
            self._read(slot)
            if slot.conn is not None:
                slot.conn.close()
            ending = self._after_exit(slot, process, now)
            if ending is not None:
                endings.append(ending)
            slot.process = slot.conn = None
            slot.holding = None
        self._slots = [slot for slot in self._slots if not (slot.retired and slot.process is None)]
        return endings

    def _enforce_deadlines(self, slot: Slot, now: float) -> None:
        if slot.kill_reason is not None:
            return
        held = slot.holding
        if held is not None and held.deadline is not None and now > held.deadline:
            reason = (
                f"killed by the runner pool: the attempt ran past its timeout of {held.timeout_s:g} s "
                f"(+{self.kill_grace_s:g} s grace) and the agent did not stop"
            )
            slot.kill_reason = (AttemptStatus.TIMEOUT, reason)
        elif self._stop_deadline is not None and now >= self._stop_deadline:
            slot.kill_reason = (AttemptStatus.FAILED, "the runner pool stopped before the attempt finished")
        else:
            return
        logger.warning("runner pool: killing worker %s: %s", describe(slot), slot.kill_reason[1])
        send_signal(slot.process, signal.SIGKILL)

    def _after_exit(self, slot: Slot, process: BaseProcess, now: float) -> tuple[str, AttemptStatus, str] | None:
        """Book a worker's exit, schedule its replacement; the attempt it held, to record."""
        code = process.exitcode
        held = slot.holding
        ending: tuple[str, AttemptStatus, str] | None = None
        replace_in: float | None = None
        if slot.kill_reason is not None:
            status, error = slot.kill_reason
            self._count("workers_killed")
            replace_in = 0.0
        elif code == EXIT_CONFIG and slot.fatal is not None:
            status, error = AttemptStatus.FAILED, slot.fatal
            self._fatal = slot.fatal
            if self._started:  # during start() the error is raised to the caller instead
                logger.error("runner pool: worker %s cannot start: %s", describe(slot), slot.fatal)
        elif code == EXIT_DRAINED:  # it was asked to stop (by stop(), or a Ctrl-C to the process group)
            status, error = AttemptStatus.FAILED, "the worker stopped before the attempt finished"
        elif code == EXIT_RECYCLE:
            status, error = AttemptStatus.TIMEOUT, "the agent's thread was stuck past its timeout"
            replace_in = 0.0
        else:
            status, error = AttemptStatus.FAILED, f"worker died ({exit_text(code)})"
            self._count("workers_died")
            slot.crashes += 1
            replace_in = min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (slot.crashes - 1))
            if self.max_restarts is not None and self._stats.workers_died > self.max_restarts:
                limit = self.max_restarts
                logger.error("runner pool: more than %d workers died; not replacing %s", limit, describe(slot))
                replace_in = None
            else:
                logger.warning("runner pool: %s, %s; replacing it in %.1f s", error, describe(slot), replace_in)
        if held is not None:
            self._count_attempt(status)
            ending = (held.attempt_id, status, error)
        if replace_in is not None and self._stop_deadline is None and not slot.retired:
            slot.restart_at = now + replace_in
        return ending

    def _read(self, slot: Slot) -> None:
        conn = slot.conn
        try:
            while conn is not None and conn.poll():
                self._on_message(slot, conn.recv())
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            # The worker is gone (a message cut short by SIGKILL reads as garbage).
            if conn is not None:
                conn.close()
            slot.conn = None

    def _on_message(self, slot: Slot, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            slot.ready = True
        elif kind == "fatal":
            slot.fatal = str(message[1])
        elif kind == "claim":
            _, attempt_id, rollout_id, timeout_s = message
            deadline = None if timeout_s is None else time.monotonic() + timeout_s + self.kill_grace_s
            slot.holding = Held(attempt_id, rollout_id, timeout_s, deadline)
        elif kind == "done":
            _, attempt_id, status = message
            if slot.holding is not None and slot.holding.attempt_id == attempt_id:
                slot.holding = None
            slot.crashes = 0
            self._count_attempt(None if status is None else AttemptStatus(status))

    def _count(self, field: str) -> None:
        self._stats = replace(self._stats, **{field: getattr(self._stats, field) + 1})

    def _count_attempt(self, status: AttemptStatus | None) -> None:
        field = {
            AttemptStatus.SUCCEEDED: "attempts_succeeded",
            AttemptStatus.TIMEOUT: "attempts_timed_out",
            None: "attempts_ended_elsewhere",
        }.get(status, "attempts_failed")
        self._count(field)


def store_counts(store_url: str, token: str | None) -> dict[str, int]:
    """Rollouts by status in the store server at `store_url` (a plain request: pools poll it from threads)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the store is reached directly
    request = urllib.request.Request(f"{store_url}/store/counts", headers=bearer_header(token))
    with opener.open(request, timeout=30) as answer:
        return {str(key): int(value) for key, value in json.loads(answer.read()).items()}


async def record_end(store: StoreClient, attempt_id: str, status: AttemptStatus, error: str) -> None:
    """Record in the store how an attempt a pool's runner held ended (the runner could not)."""
    try:
        await store.finish_attempt(attempt_id, status, error=error)
    except (InvalidTransitionError, NotFoundError) as err:
        logger.info("runner pool: attempt %s had already ended: %s", attempt_id, err)
    except AlightError as err:
        logger.warning("runner pool: could not record the end of attempt %s: %s", attempt_id, err)
