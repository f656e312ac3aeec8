"""A pool worker: one spawned process running one `Runner` against the store's HTTP URL.

The worker tells the supervisor what it holds through a one-way pipe, as small tuples:
`("ready",)`, `("fatal", message)`, `("claim", attempt_id, rollout_id, timeout_s)` and
`("done", attempt_id, status)`. SIGINT and SIGTERM make it drain: stop claiming, finish the
attempt in hand, flush, exit 0. The supervisor starts workers with both signals blocked, so a
Ctrl-C during start-up is held until the handlers are in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from alight.errors import AlightError
from alight.runner.runner import AttemptWatcher, Runner
from alight.serving.auth import TOKEN_ENV
from alight.serving.credentials import RUNNER_CREDENTIAL_ENV
from alight.types import AttemptStatus, Claim

if TYPE_CHECKING:
    from alight.agent import LitAgent

logger = logging.getLogger(__name__)

#: Exit codes a worker chooses; anything else (a signal, a crash) means it died.
EXIT_DRAINED = 0  # asked to stop, and stopped cleanly
EXIT_CONFIG = 2  # the agent or tracer cannot be loaded: restarting will not help
EXIT_RECYCLE = 75  # a timed-out agent thread is stuck: replace this process

#: Signals that make a worker drain; blocked while it starts.
DRAIN_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})

#: Agents wait on calls; math libraries they import would start one thread per core, spinning when
#: idle, and fight the trainer for the cores. What the environment sets already stays.
AGENT_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
}


#: Variables a worker removes from its environment before any agent loads (the admin token, a runner credential).
SECRET_ENV = (TOKEN_ENV, RUNNER_CREDENTIAL_ENV)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs; picklable, as spawn requires."""

    agent: str | LitAgent  # an entrypoint to load, or a picklable agent
    store_url: str
    tracer: str
    worker_id: str
    poll_interval_s: float
    max_poll_interval_s: float
    heartbeat_interval_s: float
    log_level: int
    instrument: bool
    token: str | None = field(default=None, repr=False)  # the runner credential the store knows this worker by


class _PipeWatcher(AttemptWatcher):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def claimed(self, claim: Claim) -> None:
        _send(self.conn, ("claim", claim.attempt.attempt_id, claim.rollout.rollout_id, claim.rollout.timeout_s))

    def finished(self, claim: Claim, status: AttemptStatus | None) -> None:
        _send(self.conn, ("done", claim.attempt.attempt_id, None if status is None else status.value))


def _send(conn: Connection, message: tuple[object, ...]) -> None:
    # OSError: the supervisor is gone; the orphan check stops this worker.
    with contextlib.suppress(OSError):
        conn.send(message)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point: run until told to stop, then exit without waiting for stuck threads."""
    logging.basicConfig(
        level=spec.log_level,
        format=f"%(asctime)s %(levelname)s [{spec.worker_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    code = EXIT_CONFIG
    for name in SECRET_ENV:  # the pool's own secrets stay with the pool: agents get their attempt's key
        os.environ.pop(name, None)
    try:
        _one_thread_for_agents()
        code = _run(spec, conn)
    except BaseException:
        logger.exception("worker %s crashed", spec.worker_id)
        code = 1
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: a timed-out agent thread may still run, and interpreter exit would wait for it.
        os._exit(code)


def _one_thread_for_agents() -> None:
    """Before the agent loads: math libraries start one thread, which sleeps when idle."""
    chosen = "OMP_NUM_THREADS" in os.environ
    for name, value in AGENT_THREAD_ENV.items():
        os.environ.setdefault(name, value)
    torch = sys.modules.get("torch")  # already imported by the parent's main module, which spawn re-imports
    if torch is not None and not chosen:
        torch.set_num_threads(1)


def _run(spec: WorkerSpec, conn: Connection) -> int:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()

    def drain(signum: int) -> None:
        if not stop.is_set():
            logger.info("worker %s: %s, draining", spec.worker_id, signal.Signals(signum).name)
            stop.set()

    for signum in DRAIN_SIGNALS:
        loop.add_signal_handler(signum, drain, signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DRAIN_SIGNALS)
    try:
        runner = _build_runner(spec, conn)
    except AlightError as err:
        _send(conn, ("fatal", str(err)))
        return EXIT_CONFIG
    except Exception as err:
        _send(conn, ("fatal", f"worker start-up failed: {type(err).__name__}: {err}"))
        return EXIT_CONFIG
    _send(conn, ("ready",))
    loop.run_until_complete(_serve(runner, stop))
    return EXIT_RECYCLE if runner.agent_thread_stuck else EXIT_DRAINED


def _build_runner(spec: WorkerSpec, conn: Connection) -> Runner:
    from alight.agent import LitAgent, load_agent
    from alight.store.client import StoreClient
    from alight.tracing import make_tracer

    agent = spec.agent if isinstance(spec.agent, LitAgent) else load_agent(spec.agent)
    tracer = make_tracer(spec.tracer)
    return Runner(
        agent,
        StoreClient(spec.store_url, token=spec.token or "", runner_id=spec.worker_id),
        tracer=tracer,
        worker_id=spec.worker_id,
        poll_interval_s=spec.poll_interval_s,
        max_poll_interval_s=spec.max_poll_interval_s,
        heartbeat_interval_s=spec.heartbeat_interval_s,
        watcher=_PipeWatcher(conn),
        instrument=spec.instrument,
    )


async def _serve(runner: Runner, stop: asyncio.Event) -> None:
    orphan_check = asyncio.create_task(_stop_when_orphaned(stop))
    try:
        await runner.run(stop=stop)
    finally:
        orphan_check.cancel()
        try:
            await runner.store.close()
        except AlightError as err:
            logger.warning("worker %s: closing the store client: %s", runner.worker_id, err)


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """Drain when the supervisor's process is gone (it was killed): nobody would reap us."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            logger.warning("worker: the runner pool's process is gone; draining")
            stop.set()
