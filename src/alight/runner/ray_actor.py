"""The Ray side of the Ray runner pool: one `Runner` inside a Ray actor.

`RunnerActor` is a plain class (the pool makes it a Ray actor class with its placement options),
so importing it needs no Ray. Its methods are coroutines, so Ray runs them on the actor's event
loop, concurrently: `run()` runs the runner until `drain()`, while the pool long-polls
`next_events()` for the attempts the runner claims and lets go of.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from alight.runner.runner import AttemptWatcher
from alight.runner.worker import AGENT_THREAD_ENV, SECRET_ENV, WorkerSpec
from alight.types import AttemptStatus, Claim

if TYPE_CHECKING:
    from alight.runner.runner import Runner

#: How long one `next_events` call waits for news before it returns empty (and is asked again).
EVENT_POLL_S = 10.0
#: Longest wait, after a claim, for it to be on its way to the pool before the agent runs anyway.
CLAIM_READ_WAIT_S = 2.0


class _EventLog(AttemptWatcher):
    """What the runner claims and lets go of, kept until the pool has read it."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.first = 0  # the number of the first event still kept (those before it, the pool has read)
        self.changed = asyncio.Event()
        self.sent = 0  # the events a `next_events` call has returned so far (in Ray's hands)
        self.progress = asyncio.Event()  # set when more events are returned or read

    def claimed(self, claim: Claim) -> None:
        self._add(("claim", claim.attempt.attempt_id, claim.rollout.rollout_id, claim.rollout.timeout_s))

    async def before_agent(self, claim: Claim) -> None:
        """Wait until a `next_events` call has returned the claim (up to CLAIM_READ_WAIT_S), then
        let the loop hand that answer to Ray's own threads: the pool enforces the attempt's time
        limit only for claims it knows of, and an agent that blocks this event loop would otherwise
        keep the claim from ever leaving it."""
        wanted = self.first + len(self.events)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_READ_WAIT_S
        while max(self.sent, self.first) < wanted:
            left = deadline - loop.time()
            if left <= 0:
                return
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), left)
        for _ in range(2):  # the returned call's result reaches Ray's thread through loop callbacks
            await asyncio.sleep(0)

    def finished(self, claim: Claim, status: AttemptStatus | None) -> None:
        self._add(("done", claim.attempt.attempt_id, None if status is None else status.value))

    def _add(self, event: tuple[Any, ...]) -> None:
        self.events.append(event)
        self.changed.set()


class RunnerActor:
    """One runner inside a Ray actor (made a Ray actor class by the pool, so this module imports
    without Ray). `ready()` loads the agent, `run()` runs the runner until `drain()`."""

    def __init__(self, spec: WorkerSpec) -> None:
        for name, value in AGENT_THREAD_ENV.items():  # before the agent (and its math libraries) loads
            os.environ.setdefault(name, value)
        for name in SECRET_ENV:  # the pool's own secrets stay with the pool: agents get their attempt's key
            os.environ.pop(name, None)
        logging.basicConfig(
            level=spec.log_level, format=f"%(asctime)s %(levelname)s [{spec.worker_id}] %(name)s: %(message)s"
        )
        self.spec = spec
        self.runner: Runner | None = None
        self.log = _EventLog()
        self.stop = asyncio.Event()

    async def ready(self) -> str | None:
        """Load the agent and build the runner; the one-line error when that fails."""
        from alight.agent import LitAgent, load_agent
        from alight.errors import AlightError
        from alight.runner.runner import Runner
        from alight.store.client import StoreClient
        from alight.tracing import make_tracer

        spec = self.spec
        try:
            agent = spec.agent if isinstance(spec.agent, LitAgent) else load_agent(spec.agent)
            self.runner = Runner(
                agent,
                StoreClient(spec.store_url, token=spec.token or "", runner_id=spec.worker_id),
                tracer=make_tracer(spec.tracer),
                worker_id=spec.worker_id,
                poll_interval_s=spec.poll_interval_s,
                max_poll_interval_s=spec.max_poll_interval_s,
                heartbeat_interval_s=spec.heartbeat_interval_s,
                watcher=self.log,
                instrument=spec.instrument,
            )
        except AlightError as err:
            return str(err)
        except Exception as err:
            return f"runner actor start-up failed: {type(err).__name__}: {err}"
        return None

    async def run(self) -> str:
        """Claim and run rollouts until drained: "drained", or "recycle" when a timed-out agent's
        thread is stuck and this actor should be replaced."""
        assert self.runner is not None, "ready() first"
        try:
            await self.runner.run(stop=self.stop)
        finally:
            with contextlib.suppress(Exception):
                await self.runner.store.close()
        return "recycle" if self.runner.agent_thread_stuck else "drained"

    async def drain(self) -> None:
        """Stop claiming; the attempt in hand runs to its end."""
        self.stop.set()

    async def next_events(self, seen: int, wait_s: float = EVENT_POLL_S) -> list[tuple[Any, ...]]:
        """The events after the first `seen` (those are forgotten), waiting up to `wait_s` for one."""
        log = self.log
        del log.events[: max(0, seen - log.first)]
        if seen > log.first:
            log.first = seen
            log.progress.set()
        if not log.events and wait_s > 0:
            log.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(log.changed.wait(), wait_s)
        log.sent = log.first + len(log.events)
        log.progress.set()
        return list(log.events)
