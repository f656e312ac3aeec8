"""The runner supervisor's rules, each checked once, over a fake transport whose runners do what
the test tells them, on a clock the test moves (the real transports, a worker process and a Ray
actor, are checked end to end by test_pool_protocol, test_faults, test_drain and test_ray_pool)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from alight.errors import ConfigError
from alight.runner.supervisor import Supervisor
from alight.runner.transport import Event, RunnerHandle
from alight.runner.worker import WorkerSpec
from alight.types import AttemptStatus

URL = "http://127.0.0.1:1"  # never reached: no test here ends an attempt through the thread but the drain one


class FakeRunner:
    """A runner that says what the test makes it say; `obeys_drain`: a drain ends it at once."""

    def __init__(self, name: str, first: list[Event], obeys_drain: bool) -> None:
        self.name = name
        self.alive = True
        self.events = list(first)
        self.obeys_drain = obeys_drain
        self.drained = self.killed = False
        self.stall: str | None = None

    def say(self, *event: Any) -> None:
        self.events.append(event)

    def end(self, how: str, detail: str = "") -> None:
        self.alive = False
        self.say("exit", how, detail)

    def poll(self, now: float) -> list[Event]:
        events, self.events = self.events, []
        return events

    def stalled(self, now: float) -> str | None:
        return self.stall

    def drain(self) -> None:
        self.drained = True
        if self.obeys_drain and self.alive:
            self.end("drained")

    def kill(self) -> None:
        self.killed = True
        if self.alive:
            self.end("died", "killed by signal SIGKILL")


class FakeTransport:
    noun = "runner"
    log_name = "fake runner pool"

    def __init__(self, first: list[Event] | None = None, obeys_drain: bool = True) -> None:
        self.first = [("ready",)] if first is None else first
        self.obeys_drain = obeys_drain
        self.runners: list[FakeRunner] = []

    def open(self, n_runners: int) -> None:
        pass

    def spawn(self, spec: WorkerSpec) -> RunnerHandle:
        self.runners.append(FakeRunner(spec.worker_id, self.first, self.obeys_drain))
        return self.runners[-1]

    def wait(self, runners: list[RunnerHandle], timeout_s: float) -> None:
        time.sleep(0.005)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def supervisor(transport: FakeTransport, clock: Clock, **options: Any) -> Supervisor:
    return Supervisor(transport, "m:f", options.pop("url", URL), clock=clock, **{"n_runners": 1, **options})


def step_at(pool: Supervisor, clock: Clock, at: float) -> list[Any]:
    clock.now = at
    return pool.step()


def test_a_runner_that_keeps_dying_is_replaced_after_a_backoff_that_doubles_up_to_its_cap() -> None:
    fake, clock = FakeTransport(), Clock()
    pool = supervisor(fake, clock, restart_backoff_s=1.0, max_restart_backoff_s=3.0)
    pool.launch()
    t = clock.now
    for deaths, backoff in enumerate([1.0, 2.0, 3.0, 3.0], start=1):
        fake.runners[-1].end("died", "exit code 1")
        step_at(pool, clock, t)
        assert (pool.stats().workers_died, pool.stats().workers_alive, len(fake.runners)) == (deaths, 0, deaths)
        step_at(pool, clock, t + backoff - 0.01)  # not yet
        assert len(fake.runners) == deaths and pool.running  # about to be replaced
        t += backoff
        step_at(pool, clock, t)
        assert len(fake.runners) == deaths + 1 and pool.stats().workers_restarted == deaths
    # A finished attempt ends the crash loop: the next death waits the first backoff again.
    fake.runners[-1].say("claim", "at-1", "ro-1", None)
    fake.runners[-1].say("done", "at-1", AttemptStatus.SUCCEEDED.value)
    fake.runners[-1].end("died", "exit code 1")
    step_at(pool, clock, t)
    step_at(pool, clock, t + 1.0)
    assert len(fake.runners) == 6 and pool.stats().attempts_succeeded == 1


def test_past_max_restarts_a_dead_runner_is_not_replaced_and_its_attempt_is_failed() -> None:
    fake, clock = FakeTransport(), Clock()
    pool = supervisor(fake, clock, restart_backoff_s=0.5, max_restarts=2)
    pool.launch()
    for _ in range(2):  # two deaths: within the budget, each replaced
        fake.runners[-1].end("died", "exit code 1")
        step_at(pool, clock, clock.now)
        step_at(pool, clock, clock.now + 30)
    assert (len(fake.runners), pool.stats().workers_restarted) == (3, 2)
    fake.runners[-1].say("claim", "at-3", "ro-3", 60.0)
    fake.runners[-1].end("died", "killed by signal SIGSEGV")
    endings = step_at(pool, clock, clock.now)
    assert endings == [("at-3", AttemptStatus.FAILED, "runner died (killed by signal SIGSEGV)")]
    step_at(pool, clock, clock.now + 3600)
    stats = pool.stats()
    assert len(fake.runners) == 3 and not pool.running
    assert (stats.workers_died, stats.workers_restarted, stats.workers_alive, stats.attempts_failed) == (3, 2, 0, 1)


def test_a_runner_past_its_attempts_timeout_is_killed_after_the_kill_grace_not_before() -> None:
    fake, clock = FakeTransport(), Clock()
    pool = supervisor(fake, clock, kill_grace_s=2.0)
    pool.launch()
    runner = fake.runners[0]
    runner.say("claim", "at-1", "ro-1", 10.0)
    t = clock.now
    step_at(pool, clock, t)  # the claim is read: the deadline is t + 10 s + 2 s of grace
    for at in (t + 10.0, t + 10.5, t + 11.99):
        step_at(pool, clock, at)
        assert not runner.killed, f"killed {at - t:g} s after the claim"
    step_at(pool, clock, t + 12.01)
    assert runner.killed
    [(attempt_id, status, error)] = step_at(pool, clock, t + 12.02)
    assert (attempt_id, status) == ("at-1", AttemptStatus.TIMEOUT)
    assert "past its timeout of 10 s (+2 s grace)" in error
    step_at(pool, clock, t + 12.02)  # a killed runner is replaced at once, with no backoff
    stats = pool.stats()
    assert (stats.workers_killed, stats.workers_died, stats.workers_restarted, stats.attempts_timed_out) == (1, 0, 1, 1)


def test_a_runner_its_transport_finds_stalled_is_killed_before_its_deadline() -> None:
    fake, clock = FakeTransport(), Clock()
    pool = supervisor(fake, clock)
    pool.launch()
    runner = fake.runners[0]
    runner.say("claim", "at-1", "ro-1", 300.0)
    step_at(pool, clock, clock.now)
    runner.stall = "it answered nothing for 61 s"
    step_at(pool, clock, clock.now + 1)
    [(_, status, error)] = step_at(pool, clock, clock.now)
    assert runner.killed and status is AttemptStatus.TIMEOUT
    assert error == "killed by the runner pool: it answered nothing for 61 s"


def test_a_runner_that_cannot_load_the_agent_fails_start_with_its_error() -> None:
    fake = FakeTransport(first=[("fatal", "agent m:f: no module named m"), ("exit", "fatal", "")])
    pool = Supervisor(fake, "m:f", URL, n_runners=2, clock=Clock())
    with pytest.raises(ConfigError, match="no module named m"):
        pool.start()
    assert not pool.running and len(fake.runners) == 2  # no restart for what a restart cannot fix


@pytest.mark.timeout(30)
def test_scale_starts_runners_and_retires_the_newest_which_drain_and_are_not_replaced() -> None:
    fake = FakeTransport()
    with Supervisor(fake, "m:f", URL, n_runners=1) as pool:
        pool.scale(3)
        assert len(fake.runners) == 3 and pool.n_runners == 3
        pool.scale(1)
        _eventually(lambda: pool.stats().workers_alive == 1)
        time.sleep(0.05)  # a few steps more: nothing restarts them
        assert [r.drained for r in fake.runners] == [False, True, True] and len(fake.runners) == 3
        assert pool.running
    assert not pool.running and fake.runners[0].drained


@pytest.mark.timeout(30)
def test_stop_drains_then_kills_what_outlives_the_drain_timeout(store_server: Any) -> None:
    fake = FakeTransport(obeys_drain=False)
    pool = Supervisor(fake, "m:f", store_server.url, n_runners=2, drain_timeout_s=0.3).start()
    fake.runners[0].say("claim", "at-1", "ro-1", None)
    fake.runners[1].say("claim", "at-2", "ro-2", None)
    fake.runners[1].say("done", "at-2", AttemptStatus.SUCCEEDED.value)
    _eventually(lambda: pool.stats().workers_busy == 1)
    fake.obeys_drain = fake.runners[1].obeys_drain = True
    started = time.monotonic()
    pool.stop(drain=True)
    assert time.monotonic() - started >= 0.3  # the holder had its drain timeout
    assert all(r.drained for r in fake.runners) and [r.killed for r in fake.runners] == [True, False]
    stats = pool.stats()
    assert (stats.workers_killed, stats.attempts_failed, stats.attempts_succeeded, stats.workers_alive) == (1, 1, 1, 0)
    assert not pool.running
    pool.stop()  # a second stop is a no-op


def _eventually(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
