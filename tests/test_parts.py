"""The part contract (alight.parts) for sandboxes, runner pools, stores, rewards and tracers: an
unknown kind is a one-line ConfigError naming the kinds, and a kind a test registers is chosen by
its name and asked for its capabilities (nothing compares its name)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from alight.command_agent import uses_sandbox
from alight.config.schema import RewardConfig, RunnerConfig, SandboxConfig, StoreConfig
from alight.errors import ConfigError
from alight.parts import Registry
from alight.rewards.checks import check_reward
from alight.rewards.kinds import REWARDS, RewardKind, reward_kind
from alight.runner.factory import POOLS, check_pool, make_pool
from alight.runner.pool import RunnerPool
from alight.sandbox.factory import SANDBOXES, check_sandbox, open_sandbox
from alight.sandbox.plain import PlainSandbox
from alight.store.factory import STORES, StoreSpec, check_store, open_store
from alight.store.memory import MemoryStore
from alight.tracing.factory import TRACERS, make_tracer
from alight.tracing.light import LightTracer


@pytest.fixture
def register() -> Iterator[Callable[[Registry[Any], str, type], None]]:
    """Register a test's own kind; it is forgotten when the test ends."""
    added: list[tuple[Registry[Any], str]] = []

    def add(registry: Registry[Any], kind: str, cls: type) -> None:
        registry.register(kind, cls)
        added.append((registry, kind))

    yield add
    for registry, kind in added:
        registry.unregister(kind)


def _one_line(call: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as raised:
        call()
    assert "\n" not in str(raised.value)
    return str(raised.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: check_sandbox(SandboxConfig(kind="bwrap")),
            "agent.sandbox.kind must be one of none, local, docker, got 'bwrap'",
        ),
        (lambda: check_pool(RunnerConfig(backend="k8s")), "runner.backend must be one of local, ray, got 'k8s'"),
        (lambda: check_store(StoreConfig(kind="redis")), "store.kind='redis': expected one of sqlite, memory, http"),
        (lambda: check_reward(RewardConfig(kind="jury")), "reward.kind must be one of agent, tests, judge, got 'jury'"),
        (lambda: make_tracer("jaeger"), "unknown tracer 'jaeger': choose 'light' or 'otel'"),
    ],
)
def test_an_unknown_kind_is_one_line_naming_the_kinds(call: Callable[[], object], message: str) -> None:
    assert _one_line(call) == message


class IsolatingSandbox(PlainSandbox):
    isolates = True
    checked: ClassVar[list[str]] = []

    @classmethod
    def check_config(cls, settings: Any) -> None:
        cls.checked.append(settings.kind)


def test_a_registered_sandbox_kind_is_checked_opened_and_asked_whether_it_isolates(register: Any) -> None:
    register(SANDBOXES, "jail", IsolatingSandbox)
    register(SANDBOXES, "bare", PlainSandbox)  # another kind that does not isolate
    config = SandboxConfig(kind="jail")
    check_sandbox(config)
    assert IsolatingSandbox.checked == ["jail"]
    assert uses_sandbox(config, None) and not uses_sandbox(SandboxConfig(kind="bare"), None)

    async def kind_opened() -> type:
        async with open_sandbox(config, source=None, allow=[]) as box:
            return type(box)

    assert asyncio.run(kind_opened()) is IsolatingSandbox


class FussyPool(RunnerPool):
    runners_name = "fussy workers"

    @classmethod
    def check_config(cls, cfg: RunnerConfig) -> None:
        if cfg.n_runners > 2:
            raise ConfigError("runner.backend=fussy runs 2 runners at most")


def test_a_registered_pool_kind_is_checked_and_built_by_name(register: Any) -> None:
    register(POOLS, "fussy", FussyPool)
    assert _one_line(lambda: check_pool(RunnerConfig(backend="fussy"))) == "runner.backend=fussy runs 2 runners at most"
    cfg = RunnerConfig(backend="fussy", n_runners=2)
    check_pool(cfg)
    pool = make_pool(cfg, "m:f", "http://127.0.0.1:1", instrument=False)  # built, not started
    assert isinstance(pool, FussyPool) and pool.n_runners == 2 and not pool.running


class ScratchStore(MemoryStore):
    kind = "scratch"


def test_a_registered_store_kind_is_checked_and_opened_by_name(register: Any) -> None:
    register(STORES, "scratch", ScratchStore)
    spec = check_store(StoreConfig(kind="scratch"))
    assert spec == StoreSpec("scratch") and not spec.is_file
    assert isinstance(open_store(StoreConfig(kind="scratch")), ScratchStore)
    assert StoreSpec("sqlite", path=Path("x.db")).is_file  # what the kind states, not its name
    message = _one_line(lambda: check_store(StoreConfig(kind="scratch", path="x.db")))
    assert message == "store.path is set but store.kind=scratch: a memory store has no file"


class VerifierReward(RewardKind):
    kind = "verifier"
    runs_in_sandbox = True


def test_a_registered_reward_kind_is_asked_its_capabilities(register: Any) -> None:
    register(REWARDS, "verifier", VerifierReward)
    reward = RewardConfig(kind="verifier")
    check_reward(reward)
    assert reward_kind(reward) is VerifierReward and reward_kind(None).agent_gives_reward
    assert uses_sandbox(SandboxConfig(), reward) and not uses_sandbox(SandboxConfig(), RewardConfig())
    assert reward_kind(RewardConfig(kind="judge")).wraps_agent and not reward_kind(reward).wraps_agent


class QuietTracer(LightTracer):
    pass


def test_a_registered_tracer_kind_is_made_by_name(register: Any) -> None:
    register(TRACERS, "quiet", QuietTracer)
    assert isinstance(make_tracer("quiet"), QuietTracer)
    assert isinstance(make_pool(RunnerConfig(tracer="quiet"), "m:f", "http://127.0.0.1:1"), RunnerPool)
