"""`alight train` on a recipe for its slow tests: the CLI run in a subprocess, the embedded tiny model
(untrained), then what every such run must show: steps 0..2 in metrics.jsonl, each train step's
rollouts succeeded, and in the store each train rollout's reward the tests reward's and LLM spans of
the recipe's agent with the engine's token ids."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from alight import semconv
from alight.types import Rollout, Span, SpanKind

REPO = Path(__file__).resolve().parents[2]


def check_two_steps_of_train(config: Path, agent: str, run_dir: Path, overrides: list[str], timeout_s: int) -> None:
    """`alight train config trainer.steps=2 *overrides` into `run_dir`, then the checks above;
    `overrides` set trainer.batch_size, group_size and val_size=1."""

    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "alight", "train", str(config), "trainer.steps=2", *overrides, "logging.plot=false"]
    done = subprocess.run(
        [*argv, "--run-dir", str(run_dir)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    size = {key: int(value) for key, _, value in (o.partition("=") for o in overrides) if key.startswith("trainer.")}
    check_the_run(run_dir, agent, per_step=size["trainer.batch_size"] * size["trainer.group_size"])


def check_the_run(run_dir: Path, agent: str, *, per_step: int) -> None:
    """What a 2-step run in `run_dir` must show (the module docstring); `per_step` rollouts a step."""
    from alight.store.sqlite import SqliteStore
    from alight.types import RolloutMode

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics[1:]:
        assert m["rollouts/succeeded"] == per_step and 0.0 <= m["train/reward_mean"] <= 1.0, m
        assert m["transitions"] >= per_step, m
    assert all(0.0 <= m["val/reward_mean"] <= 1.0 for m in (metrics[0], metrics[2]))

    async def read() -> list[tuple[Rollout, list[Span]]]:
        store = SqliteStore(run_dir / "store.db")
        try:
            rollouts = await store.list_rollouts(mode=RolloutMode.TRAIN)
            return [(r, await store.query_spans(r.rollout_id)) for r in rollouts]
        finally:
            await store.close()

    stored = asyncio.run(read())
    assert len(stored) == 2 * per_step
    for rollout, spans in stored:
        [tests] = [s for s in spans if s.kind == SpanKind.REWARD]
        assert rollout.reward == tests.attributes[semconv.REWARD_VALUE]
        calls = [s for s in spans if s.kind == SpanKind.LLM]
        assert calls and {s.attributes.get(semconv.AGENT_NAME) for s in calls} == {agent}
        # the embedded engine's token ids on each answered call (a call past the tiny model's context has none)
        assert any(s.attributes.get(semconv.LLM_RESPONSE_TOKEN_IDS) for s in calls)
