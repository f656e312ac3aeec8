"""The local runner pool: `n_runners` worker processes (alight.runner.worker) under the runner
supervisor (alight.runner.supervisor), which kills hung workers, replaces dead ones, scales and
drains. This module is the local transport: starting a worker process, reading what it tells
the supervisor through a pipe, and signalling it (SIGTERM drains, SIGKILL kills). Ctrl-C reaches
every worker of the terminal's process group, which drains as SIGTERM makes it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Unpack

from alight.errors import ConfigError
from alight.runner.base import PoolOptions
from alight.runner.supervisor import Supervisor
from alight.runner.transport import Event, RunnerHandle
from alight.runner.worker import DRAIN_SIGNALS, EXIT_CONFIG, EXIT_DRAINED, EXIT_RECYCLE, WorkerSpec, worker_main

if TYPE_CHECKING:
    from alight.agent import LitAgent
    from alight.config.schema import RunnerConfig


class RunnerPool(Supervisor):
    """`n_runners` worker processes running `agent` on rollouts from the store at `store_url`.

    `agent` is an entrypoint (`module:name` or `file.py:name`), loaded in each worker, or a
    picklable `LitAgent`. Use `start()`/`stop()` or `with RunnerPool(...) as pool:`. `token`
    (default: `ALIGHT_TOKEN`) reaches the store; workers scope their writes to their own attempts
    and hand it to agents as the LLM `api_key` (the proxy's bearer token). The other keyword
    arguments (`n_runners`, `tracer`, `drain_timeout_s`, `kill_grace_s`, `restart_backoff_s`,
    `max_restarts`, `instrument`, ...) are the supervisor's (alight.runner.supervisor)."""

    runners_name = "workers"

    @classmethod
    def from_config(cls, cfg: RunnerConfig, agent: str | LitAgent, store_url: str, **options: Any) -> RunnerPool:
        return cls(agent, store_url, **options)

    def __init__(self, agent: str | LitAgent, store_url: str, **options: Unpack[PoolOptions]) -> None:
        if not isinstance(agent, str):
            try:
                pickle.dumps(agent)
            except Exception as err:
                raise ConfigError(
                    f"agent {getattr(agent, 'name', agent)!r} cannot be sent to worker processes "
                    f"({type(err).__name__}); pass its entrypoint 'module:name' instead"
                ) from None
        super().__init__(ProcessTransport(), agent, store_url, **options)


class ProcessTransport:
    """Runners as spawned worker processes on this machine."""

    noun = "worker"
    log_name = "runner pool"

    def open(self, n_runners: int) -> None:
        pass

    def spawn(self, spec: WorkerSpec) -> RunnerHandle:
        ctx = mp.get_context("spawn")
        receiver, sender = ctx.Pipe(duplex=False)
        process = ctx.Process(target=worker_main, args=(spec, sender), name=spec.worker_id)
        # Blocked signals are inherited: a Ctrl-C during the worker's start-up waits for its handlers.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, DRAIN_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        sender.close()
        return _WorkerProcess(process, receiver)

    def wait(self, runners: list[RunnerHandle], timeout_s: float) -> None:
        waitables: list[Any] = []
        for runner in runners:
            assert isinstance(runner, _WorkerProcess)
            waitables += [runner.process.sentinel, *([runner.conn] if runner.conn is not None else [])]
        wait(waitables, timeout=timeout_s) if waitables else time.sleep(timeout_s)

    def close(self) -> None:
        pass


class _WorkerProcess:
    """One worker process and the pipe it reports through."""

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn: Connection | None = conn
        self.said_fatal = False

    @property
    def name(self) -> str:
        return f"{self.process.name} (pid {self.process.pid})"

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None

    def poll(self, now: float) -> list[Event]:
        events = self._read()
        code = self.process.exitcode
        if code is None:
            return events
        self.process.join(0)
        events += self._read()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if code == EXIT_CONFIG and self.said_fatal:
            return [*events, ("exit", "fatal", "")]
        if code in (EXIT_DRAINED, EXIT_RECYCLE):
            return [*events, ("exit", "drained" if code == EXIT_DRAINED else "recycle", "")]
        return [*events, ("exit", "died", exit_text(code))]

    def stalled(self, now: float) -> str | None:
        return None  # a worker's deadlines are its attempts'

    def drain(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: signal.Signals) -> None:
        if self.process.pid is not None and self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def _read(self) -> list[Event]:
        events: list[Event] = []
        conn = self.conn
        try:
            while conn is not None and conn.poll():
                events.append(conn.recv())
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            # The worker is gone (a message cut short by SIGKILL reads as garbage).
            if conn is not None:
                conn.close()
            self.conn = None
        self.said_fatal = self.said_fatal or any(event[0] == "fatal" for event in events)
        return events


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
