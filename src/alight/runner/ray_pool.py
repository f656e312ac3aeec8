"""The Ray runner pool (`runner.backend: ray`): runners as Ray actors, on one machine or a cluster.

Each actor (`RunnerActor`, alight.runner.ray_actor) runs a `Runner` with its own `StoreClient`
over HTTP, on the actor's event loop, and reports what it holds through a long poll
(`next_events`). The runner supervisor (alight.runner.supervisor) keeps the pool whole, as it
does the local pool's: an actor that dies (its node is lost, the OOM killer, `ray.kill`, a
crash) has its attempt recorded as failed and is replaced after a backoff; one whose attempt
runs past its timeout plus `kill_grace_s` is killed and replaced; `stop(drain=True)` lets the
actors finish their attempts within `drain_timeout_s`. This module is the Ray transport.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from alight.config.schema import RayConfig, RunnerConfig
from alight.runner.base import PoolOptions
from alight.runner.ray_actor import EVENT_POLL_S, RunnerActor
from alight.runner.ray_cluster import actor_options, check_capacity, check_ray, connect
from alight.runner.supervisor import Supervisor
from alight.runner.transport import Event, RunnerHandle
from alight.runner.worker import WorkerSpec

if TYPE_CHECKING:
    from alight.agent import LitAgent

logger = logging.getLogger(__name__)


class RayRunnerPool(Supervisor):
    """`n_runners` Ray actors running `agent` on rollouts from the store at `store_url`.

    `ray` (a `RayConfig`) says which cluster to join (`address`; None starts a local one unless
    Ray is already initialised in this process) and what each actor reserves (`num_cpus`,
    `resources`, `label_selector`, `spread`). `agent` is an entrypoint (a file path is made
    absolute, so actors on this machine find it; on other nodes use a module or the same path) or
    a `LitAgent` Ray can pickle. An actor whose long poll stays unanswered `unresponsive_s` past
    EVENT_POLL_S has its event loop blocked (by an agent): it can neither heartbeat nor report, so
    it is killed and replaced. The other arguments mean what they mean for `RunnerPool`."""

    runners_name = "Ray actors"

    @classmethod
    def check_config(cls, cfg: RunnerConfig) -> None:
        check_ray(cfg.ray)

    @classmethod
    def from_config(cls, cfg: RunnerConfig, agent: str | LitAgent, store_url: str, **options: Any) -> RayRunnerPool:
        return cls(agent, store_url, ray=cfg.ray, **options)

    def __init__(
        self,
        agent: str | LitAgent,
        store_url: str,
        *,
        ray: RayConfig | None = None,
        unresponsive_s: float = 60.0,
        **options: Unpack[PoolOptions],
    ) -> None:
        self.ray_config = ray or RayConfig()
        self.unresponsive_s = unresponsive_s
        agent = _absolute_entrypoint(agent) if isinstance(agent, str) else agent
        super().__init__(RayTransport(self.ray_config, unresponsive_s), agent, store_url, **options)

    @property
    def dashboard_url(self) -> str | None:
        """The Ray dashboard, when this pool started Ray."""
        transport = self.transport
        return transport.dashboard_url if isinstance(transport, RayTransport) else None


class RayTransport:
    """Runners as Ray actors; joins (or starts) Ray when the pool starts, and shuts down a Ray it
    started when the pool stops."""

    noun = "runner actor"
    log_name = "ray runner pool"

    def __init__(self, cfg: RayConfig, unresponsive_s: float) -> None:
        self.cfg = cfg
        self.unresponsive_s = unresponsive_s
        self.dashboard_url: str | None = None
        self._owns_ray = False  # this pool started (or joined) Ray, so it shuts Ray down at stop
        self._actor_class: Any = None

    def open(self, n_runners: int) -> None:
        ray, self._owns_ray, self.dashboard_url = connect(self.cfg)
        check_capacity(ray, self.cfg, n_runners)
        self._actor_class = ray.remote(**actor_options(self.cfg))(RunnerActor)

    def spawn(self, spec: WorkerSpec) -> RunnerHandle:
        name = f"alight-{spec.worker_id}"
        return _ActorRunner(name, self._actor_class.options(name=name).remote(spec), self.unresponsive_s)

    def wait(self, runners: list[RunnerHandle], timeout_s: float) -> None:
        import ray

        waiting: dict[Any, _ActorRunner] = {}
        for runner in runners:
            assert isinstance(runner, _ActorRunner)
            waiting.update((ref, runner) for ref in runner.refs())
        if not waiting:
            time.sleep(timeout_s)
            return
        refs = list(waiting)
        ray.wait(refs, num_returns=1, timeout=timeout_s)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            waiting[ref].answered.append(ref)

    def close(self) -> None:
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False


class _ActorRunner:
    """One runner actor and the calls to it still pending: loading the agent (`ready`), running
    (`run`) and the long poll for its events (`next_events`)."""

    def __init__(self, name: str, actor: Any, unresponsive_s: float) -> None:
        self.name = name
        self.actor = actor
        self.unresponsive_s = unresponsive_s
        self.ready_ref: Any = actor.ready.remote()
        self.run_ref: Any = None
        self.events_ref: Any = None
        self.events_asked_at = 0.0  # when the long poll now pending was sent
        self.seen = 0  # events read so far
        self.answered: list[Any] = []  # refs `wait` found answered, read by the next `poll`
        self.alive = True

    def refs(self) -> list[Any]:
        return [ref for ref in (self.ready_ref, self.events_ref, self.run_ref) if ref is not None]

    def poll(self, now: float) -> list[Event]:
        import ray

        answered, self.answered = self.answered, []
        events: list[Event] = []
        # Events first: an actor's last "done" must be read before its exit is booked.
        for ref in sorted(answered, key=lambda r: 0 if r == self.events_ref else 1):
            if ref not in self.refs():
                continue
            try:
                answer = ray.get(ref, timeout=0)
            except Exception as err:  # the actor is gone: RayActorError, OutOfMemoryError, a node lost
                return [*events, *self._exit("died", _death_text(err))]
            if ref == self.events_ref:
                events += self._take(answer)
                self._ask_events(now)
            elif ref == self.ready_ref:
                self.ready_ref = None
                if answer is not None:
                    return [*events, ("fatal", str(answer)), *self._exit("fatal")]
                events.append(("ready",))
                self.run_ref = self.actor.run.remote()
                self._ask_events(now)
            elif ref == self.run_ref:
                with contextlib.suppress(Exception):  # its last events, if the long poll has not brought them
                    events += self._take(ray.get(self.actor.next_events.remote(self.seen, 0.0), timeout=10))
                return [*events, *self._exit(str(answer))]
        return events

    def stalled(self, now: float) -> str | None:
        silent = now - self.events_asked_at
        if self.events_ref is not None and silent > EVENT_POLL_S + self.unresponsive_s:
            return f"the actor answered nothing for {silent:.0f} s (its event loop is blocked)"
        return None

    def drain(self) -> None:
        with contextlib.suppress(Exception):
            self.actor.drain.remote()

    def kill(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def _ask_events(self, now: float) -> None:
        self.events_ref = self.actor.next_events.remote(self.seen)
        self.events_asked_at = now

    def _take(self, events: list[Event]) -> list[Event]:
        self.seen += len(events)
        return events

    def _exit(self, how: str, detail: str = "") -> list[Event]:
        self.kill()  # a drained actor's process goes, and its CPUs go back to the cluster
        self.ready_ref = self.run_ref = self.events_ref = None
        self.alive = False
        return [("exit", how, detail)]


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
