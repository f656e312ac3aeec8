"""One runner's loop, in-process: claim a rollout, run the agent on it, report how it ended.

For each claim the runner binds the resources (the rollout's pinned version, else the latest),
starts the attempt, heartbeats from an asyncio task while the agent runs under the rollout's
time limit, flushes the tracer's spans, and finishes the attempt: succeeded with the reward the
agent returned (else the last reward it emitted), failed with the traceback, or timed out. No
single rollout, and no store hiccup, stops the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from alight.agent import AgentFailure, LitAgent, bind_resources
from alight.errors import AlightError, InvalidTransitionError, NotFoundError
from alight.tracing import AttemptContext, emit_exception, emit_reward
from alight.types import Attempt, AttemptStatus, Claim, ResourceSet, Rollout, new_id

if TYPE_CHECKING:
    from alight.store.base import Store
    from alight.tracing import Tracer

logger = logging.getLogger(__name__)

#: How long a cancelled agent gets to stop before the runner gives up on it.
CANCEL_WAIT_S = 0.5


class AttemptWatcher:
    """Hooks the runner calls around each claim; the pool's workers report them to the supervisor."""

    def claimed(self, claim: Claim) -> None:
        """The runner now holds `claim.attempt` (its time limit counts from about now)."""

    async def before_agent(self, claim: Claim) -> None:
        """Awaited after `claimed`, before the agent runs: a watcher that reports to a supervisor
        through the runner's own event loop waits here until the report is out (an agent that
        blocks the loop would otherwise hide the claim from the supervisor)."""

    def finished(self, claim: Claim, status: AttemptStatus | None) -> None:
        """The runner let go of the attempt; `status` is how it ended (None: it ended elsewhere)."""


@dataclass
class Outcome:
    """How one attempt ended, as the runner reports it to the store."""

    status: AttemptStatus | None  # None: the attempt already ended in the store (watchdog, cancel)
    reward: float | None = None
    error: str | None = None


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor (where `asyncio.to_thread` runs sync agents), counting the
    calls in progress: a timed-out sync agent leaves one behind that cannot be cancelled."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="alight-agent")
        self._lock = threading.Lock()
        self.active = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def counted() -> Any:
            with self._lock:
                self.active += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.active -= 1

        return super().submit(counted)


_executors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _CountingExecutor] = weakref.WeakKeyDictionary()


def _thread_counter() -> _CountingExecutor:
    loop = asyncio.get_running_loop()
    executor = _executors.get(loop)
    if executor is None:
        executor = _executors[loop] = _CountingExecutor()
        loop.set_default_executor(executor)
    return executor


class Runner:
    """Runs `agent` on rollouts claimed from `store`, one at a time, recording spans with `tracer`."""

    def __init__(
        self,
        agent: LitAgent,
        store: Store,
        *,
        tracer: Tracer,
        worker_id: str | None = None,
        poll_interval_s: float = 0.05,
        max_poll_interval_s: float = 0.5,
        heartbeat_interval_s: float = 2.0,
        watcher: AttemptWatcher | None = None,
        instrument: bool = True,
        llm_api_key: str | None = None,
    ) -> None:
        self.agent = agent
        self.llm_api_key = llm_api_key  # what agents send as their api_key when the resource names none
        self.store = store
        self.tracer = tracer
        self.worker_id = worker_id or new_id("runner")
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max(poll_interval_s, max_poll_interval_s)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.watcher = watcher or AttemptWatcher()
        #: Set when a timed-out agent was left running in a thread; the process should be replaced.
        self.agent_thread_stuck = False
        self._resource_sets: dict[int, ResourceSet] = {}
        self.instrument = instrument
        if instrument:  # hook openai & co. so the agent's calls are traced (once per process)
            tracer.instrument()

    # -- the loop ---------------------------------------------------------------------------
    async def run(
        self,
        *,
        max_rollouts: int | None = None,
        stop: asyncio.Event | None = None,
        idle_exit_s: float | None = None,
    ) -> int:
        """Claim and run rollouts until `stop` is set, `max_rollouts` were run, the queue stayed
        empty for `idle_exit_s` seconds, or a timed-out agent is stuck in its thread. A claim in
        hand is always run to its end. Returns the number of attempts run."""
        done = 0
        delay = self.poll_interval_s
        idle_since = time.monotonic()
        while not (stop is not None and stop.is_set()) and not self.agent_thread_stuck:
            if max_rollouts is not None and done >= max_rollouts:
                break
            try:
                claim = await self.store.dequeue(self.worker_id)
            except AlightError as err:
                logger.warning("runner %s: dequeue failed (%s); trying again", self.worker_id, err)
                claim = None
            if claim is None:
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    break
                await _sleep_unless_set(stop, delay)
                delay = min(delay * 2, self.max_poll_interval_s)
                continue
            delay = self.poll_interval_s
            await self.run_claim(claim)
            done += 1
            idle_since = time.monotonic()
        if self.agent_thread_stuck:
            logger.warning("runner %s: an agent thread is stuck past its timeout; stopping this runner", self.worker_id)
        return done

    # -- one claim --------------------------------------------------------------------------
    async def run_claim(self, claim: Claim) -> Rollout:
        """Run the agent on a claimed rollout and finish its attempt; returns the rollout as the
        store has it afterwards (as claimed, if the store could not be told)."""
        self.watcher.claimed(claim)
        outcome = Outcome(status=None)
        try:
            await self.watcher.before_agent(claim)
            outcome = await self._attempt(claim)
            return await self._finish(claim, outcome)
        except asyncio.CancelledError:
            # The runner itself is being stopped: the attempt must not stay open until the watchdog.
            outcome = Outcome(AttemptStatus.FAILED, error="the runner was stopped while the attempt ran")
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finish(claim, outcome))
            raise
        finally:
            self.watcher.finished(claim, outcome.status)

    async def _attempt(self, claim: Claim) -> Outcome:
        rollout, attempt = claim.rollout, claim.attempt
        try:
            resource_set = await self._resources_for(rollout)
        except AlightError as err:
            return Outcome(AttemptStatus.FAILED, error=f"cannot get the resources of this rollout: {err}")
        resources = bind_resources(
            resource_set, rollout.rollout_id, attempt.attempt_id, api_key=self.llm_api_key, agent_key=claim.agent_key
        )
        try:
            attempt = await self.store.start_attempt(attempt.attempt_id)
        except (InvalidTransitionError, NotFoundError) as err:
            logger.info("runner %s: attempt %s ended before it started: %s", self.worker_id, attempt.attempt_id, err)
            return Outcome(status=None)
        outcome: Outcome | None = None
        try:
            async with self.tracer.attempt(self.store, rollout, attempt, agent_name=self.agent.name) as ctx:
                ctx.numbered = self.instrument  # uninstrumented calls carry no numbers: see AttemptContext
                outcome = await self._run_agent(rollout, attempt, resources, ctx)
        except Exception as err:
            # Entering or flushing the tracer failed (a store outage past the client's retries):
            # the agent's result still counts, its spans are what the store got.
            logger.warning("runner %s: recording spans of %s failed: %s", self.worker_id, attempt.attempt_id, err)
            if outcome is None:
                return Outcome(AttemptStatus.FAILED, error="".join(traceback.format_exception(err)))
        return outcome

    async def _run_agent(
        self, rollout: Rollout, attempt: Attempt, resources: dict[str, Any], ctx: AttemptContext
    ) -> Outcome:
        threads = _thread_counter()
        agent_task = asyncio.create_task(
            self.agent.run(rollout.task.input, resources, rollout, attempt), name=f"agent-{attempt.attempt_id}"
        )
        ended_elsewhere = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(attempt, ctx, agent_task, ended_elsewhere))
        try:
            await asyncio.wait({agent_task}, timeout=rollout.timeout_s)
        except asyncio.CancelledError:  # the runner is stopped: so is its agent
            agent_task.cancel()
            raise
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        if not agent_task.done():
            await self._stop_agent(agent_task, threads)
            return Outcome(
                AttemptStatus.TIMEOUT,
                error=f"the agent ran past the rollout's timeout of {rollout.timeout_s:g} s and was stopped",
            )
        if ended_elsewhere.is_set():
            await self._stop_agent(agent_task, threads)
            return Outcome(status=None)
        if agent_task.cancelled():
            return Outcome(AttemptStatus.FAILED, error="the agent was cancelled")
        err = agent_task.exception()
        if err is not None:
            emit_exception(err)
            error = str(err) if isinstance(err, AgentFailure) else "".join(traceback.format_exception(err))
            return Outcome(AttemptStatus.FAILED, error=error)
        result = agent_task.result()
        if result is not None:
            emit_reward(result, name="final")  # finite: the agent wrapper checked it
            return Outcome(AttemptStatus.SUCCEEDED, reward=result)
        return Outcome(AttemptStatus.SUCCEEDED, reward=ctx.last_reward)

    async def _stop_agent(self, agent_task: asyncio.Task[Any], threads: _CountingExecutor) -> None:
        if not await _cancel(agent_task, threads):
            # A sync agent in its thread (or a coroutine that ignores cancellation) goes on running.
            self.agent_thread_stuck = True

    async def _heartbeat(
        self, attempt: Attempt, ctx: AttemptContext, agent_task: asyncio.Task[Any], ended_elsewhere: asyncio.Event
    ) -> None:
        """Tell the store the attempt is alive and flush spans so far; stop the agent when the
        store says the attempt has ended (timed out by the watchdog, rollout cancelled)."""
        interval = self.heartbeat_interval_s
        if attempt.heartbeat_timeout_s is not None:
            interval = min(interval, attempt.heartbeat_timeout_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.store.heartbeat(attempt.attempt_id)
            except (InvalidTransitionError, NotFoundError) as err:
                logger.info("runner %s: %s; stopping its agent", self.worker_id, err)
                ended_elsewhere.set()
                agent_task.cancel()
                return
            except AlightError as err:
                logger.warning("runner %s: heartbeat of %s failed: %s", self.worker_id, attempt.attempt_id, err)
            try:
                await ctx.flush()
            except Exception as err:
                logger.warning("runner %s: flushing spans of %s failed: %s", self.worker_id, attempt.attempt_id, err)

    async def _resources_for(self, rollout: Rollout) -> ResourceSet | None:
        version = rollout.resources_version
        if version is None:
            latest = await self.store.get_latest_resources()
            if latest is not None:
                self._resource_sets.setdefault(latest.version, latest)
            return latest
        known = self._resource_sets.get(version)
        if known is None:
            known = self._resource_sets[version] = await self.store.get_resources(version)
        return known

    async def _finish(self, claim: Claim, outcome: Outcome) -> Rollout:
        attempt_id = claim.attempt.attempt_id
        if outcome.status is None:
            return claim.rollout
        if outcome.status is not AttemptStatus.SUCCEEDED:
            logger.info(
                "runner %s: attempt %s of rollout %s %s: %s",
                self.worker_id,
                attempt_id,
                claim.rollout.rollout_id,
                outcome.status.value,
                _last_line(outcome.error),
            )
        try:
            return await self.store.finish_attempt(
                attempt_id, outcome.status, reward=outcome.reward, error=outcome.error
            )
        except (InvalidTransitionError, NotFoundError) as err:
            # The watchdog (or a cancel) ended it first; its verdict stands.
            logger.info("runner %s: could not finish %s: %s", self.worker_id, attempt_id, err)
        except AlightError as err:
            logger.warning("runner %s: could not finish %s: %s", self.worker_id, attempt_id, err)
        return claim.rollout


async def _cancel(task: asyncio.Task[Any], threads: _CountingExecutor) -> bool:
    """Cancel the agent's task; True when it and any thread it ran in stopped within CANCEL_WAIT_S."""
    task.cancel()
    deadline = time.monotonic() + CANCEL_WAIT_S
    await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
    while threads.active and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
    return task.done() and threads.active == 0


async def _sleep_unless_set(event: asyncio.Event | None, seconds: float) -> None:
    if event is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""
