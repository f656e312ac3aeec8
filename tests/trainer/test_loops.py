"""The loop seam: `make_loop` chooses one loop per config, each loop a file composed of shared
parts; the config is validated once; APO scores a prompt over every rollout it ran."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError
from alight.trainer.loops import LOOPS, loop_kind, make_loop

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "alight"


def config(**sections: object) -> ExperimentConfig:
    cfg = ExperimentConfig()
    for name, changes in sections.items():
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **changes)})  # type: ignore[arg-type]
    return cfg


def test_make_loop_chooses_the_loop_by_the_config(tmp_path: Path) -> None:
    from alight.trainer.loops.apo import ApoLoop
    from alight.trainer.loops.async_rl import AsyncRLLoop
    from alight.trainer.loops.rl import RLLoop
    from alight.trainer.loops.sft_store import SFTStoreLoop

    rows = [{"question": "q"}] * 4
    cases = [
        (config(algorithm={"name": "grpo"}), "rl", RLLoop),
        (config(algorithm={"name": "sft"}), "rl", RLLoop),  # sft on the agent's best rollouts
        (config(trainer={"mode": "async"}), "async_rl", AsyncRLLoop),
        (config(trainer={"mode": "async", "max_staleness": 0}), "async_rl", AsyncRLLoop),
        (config(algorithm={"name": "sft"}, data={"from_store": str(tmp_path)}), "sft_store", SFTStoreLoop),
        (config(algorithm={"name": "apo"}, engine={"kind": "litellm"}), "apo", ApoLoop),
    ]
    for cfg, kind, cls in cases:
        assert loop_kind(cfg) == kind
        loop = make_loop(kind, cfg, tmp_path / kind, rows, rows)
        assert type(loop) is cls and callable(loop.run)
    assert set(LOOPS) == {"rl", "async_rl", "apo", "sft_store"}
    assert not list(tmp_path.glob("*/*")), "building a loop writes nothing: run() does"


def test_no_loop_inherits_from_another() -> None:
    for path in (SRC / "trainer" / "loops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Loop") and node.name != "Loop":
                bases = [ast.unparse(base) for base in node.bases]
                assert bases in ([], ["LoopKind"]), f"{path.name}: {node.name} subclasses {bases}"  # facts, not hooks


# -- validate once ------------------------------------------------------------------------------

#: Each check of a part's config -> the only modules that call it. The run's config is checked in
#: one pass (alight.trainer.checks); factories, backends, the stack and the loops trust it. `alight
#: dev`, `alight runner` and the SFT export are entry points of their own.
CALLERS = {
    "check_trainer": {"trainer/checks.py"},
    "check_backend": {"trainer/checks.py", "trainer/loops/apo.py"},  # APO: for a warm start only
    "check_algorithm": {"backends/factory.py"},  # inside check_backend
    # each loop's own settings, in its check_config (called by trainer/checks.py)
    "check_apo": {"trainer/loops/apo.py"},
    "check_selection": {"trainer/loops/sft_store.py", "commands/export.py", "algorithms/sft.py"},
    "check_source": {"trainer/loops/sft_store.py"},
    # each command checks once: train, dev and eval (validate, checks.py), `alight runner` (service.py)
    "check_pool": {"trainer/checks.py", "runner/service.py"},
    # the stack parses the spec it opens (dev starts one too); open_store parses a URL it is given
    "check_store": {"trainer/checks.py", "trainer/stack.py", "store/factory.py"},
}


def test_each_config_check_is_called_from_its_one_pass() -> None:
    found: dict[str, set[str]] = {name: set() for name in CALLERS}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in found:
                    found[name].add(str(path.relative_to(SRC)))
    for name, callers in found.items():
        assert callers <= CALLERS[name], f"{name} is called from {sorted(callers - CALLERS[name])} too"
    assert found["check_backend"] and found["check_pool"]  # the scan sees calls


def test_validation_refuses_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    from alight.trainer.checks import validate

    agent = {"entrypoint": str(REPO / "recipes" / "calc" / "agent.py") + ":solve"}
    cases = [
        (config(algorithm={"name": "dpo"}, agent=agent), "algorithm.name must be one of grpo, ppo, sft, apo"),
        (config(engine={"kind": "litellm"}, agent=agent), "engine.kind litellm serves a model alight cannot update"),
        (config(algorithm={"loss": "mse"}, agent=agent), "algorithm.loss must be one of"),
        (config(algorithm={"name": "grpo"}, data={"from_store": str(tmp_path)}, agent=agent), "algorithm.name=sft"),
        (config(runner={"n_runners": -1}, agent=agent), "runner.n_runners"),
        (config(trainer={"group_size": 1}, agent=agent), "trainer.group_size must be at least 2"),
        (config(store={"kind": "s3"}, agent=agent), "store.kind"),
        (config(trainer={"mode": "offline"}, agent=agent), "trainer.mode must be one of sync, async"),
        (config(trainer={"mode": "async", "max_staleness": -1}, agent=agent), "trainer.max_staleness"),
        (config(trainer={"mode": "async", "on_stale": "keep"}, agent=agent), "trainer.on_stale must be one of drop"),
        (config(trainer={"mode": "async"}, algorithm={"name": "apo"}, agent=agent), "mode=async trains weights"),
        (config(algorithm={"is_cap": 0.5}, agent=agent), "algorithm.is_cap"),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            validate(cfg)
        assert "\n" not in str(err.value)
    validate(config(algorithm={"name": "apo"}, engine={"kind": "litellm"}, agent=agent))  # APO needs no backend


# -- APO scoring ----------------------------------------------------------------------------------


def test_apo_scores_failed_and_unfinished_rollouts_as_zero() -> None:
    """A prompt's score is the mean over all its rollouts: a failed, timed-out or unfinished one
    counts 0, it is not skipped (skipping would score a prompt whose agent crashes as a good one)."""
    from alight.trainer.loops.apo import score_prompts
    from alight.types import Rollout, RolloutStatus, Task

    def ended(rid: str, status: RolloutStatus, reward: float | None) -> Rollout:
        return Rollout(rollout_id=rid, task=Task(input="t"), status=status, reward=reward)

    rollouts = [
        ended("a1", RolloutStatus.SUCCEEDED, 1.0),
        ended("a2", RolloutStatus.FAILED, None),
        ended("a3", RolloutStatus.SUCCEEDED, 1.0),
        ended("a4", RolloutStatus.TIMEOUT, 1.0),  # a reward emitted before the timeout does not count
        ended("b1", RolloutStatus.SUCCEEDED, 0.5),
        ended("b2", RolloutStatus.SUCCEEDED, 0.0),
    ]
    first, second = score_prompts([["a1", "a2", "a3", "a4", "a5"], ["b1", "b2"]], rollouts)  # a5 never ended
    assert first.score == pytest.approx(2 / 5)
    assert first.rewards == {"a1": 1.0, "a2": None, "a3": 1.0, "a4": None, "a5": None}
    assert second.score == pytest.approx(0.25) and second.rewards == {"b1": 0.5, "b2": 0.0}
