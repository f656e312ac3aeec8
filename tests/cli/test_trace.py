"""`alight trace` on a hand-made run: listing, one rollout's tree, `--transitions` with the config's
settings and Hydra overrides, and bad input as one line with exit code 2."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, Rollout, Task
from tests.adapters.factory import Trace

REPO = Path(__file__).resolve().parents[2]


def alight(*args: str) -> subprocess.CompletedProcess[str]:
    path = f"{REPO / 'src'}{os.pathsep}{REPO}"  # this checkout's code (whichever is installed), then tests.*
    env = {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


@dataclass
class Run:
    dir: Path
    rollout_ids: list[str]


async def _record(db: Path) -> list[str]:
    """A group of two rollouts (rewards 1 and 0), each a writer call, a checker call and a reward."""
    store = SqliteStore(db)
    try:
        queued = await store.enqueue([Rollout(task=Task(input={"q": i}), group_id="g-1") for i in range(2)])
        for reward in (1.0, 0.0):
            claim = await store.dequeue("w")
            assert claim is not None
            trace = Trace(claim.rollout.rollout_id, claim.attempt.attempt_id)
            trace.llm([1, 2, 3], [4, 5], agent="writer", reply={"role": "assistant", "content": "draft"})
            trace.llm([1, 2, 3, 4, 5], [6], agent="checker", reply={"role": "assistant", "content": "ok"})
            trace.reward(reward)
            await store.add_spans(trace.spans)
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=reward)
        return [r.rollout_id for r in queued]
    finally:
        await store.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run_dir = tmp_path_factory.mktemp("run")
    return Run(run_dir, asyncio.run(_record(run_dir / "store.db")))


def test_transitions_take_hydra_overrides_over_the_defaults(run: Run) -> None:
    rollout_id = run.rollout_ids[0]
    every = alight("trace", str(run.dir), "--rollout", rollout_id, "--transitions", "--json")
    assert every.returncode == 0, every.stderr
    data = json.loads(every.stdout)
    assert data["settings"]["agent_match"] is None and data["settings"]["advantage"] == "grpo"
    assert [t["agent_name"] for t in data["transitions"]] == ["writer", "checker"]

    only_writer = alight(
        "trace", str(run.dir), "--rollout", rollout_id, "--transitions", "--json",
        "adapter.agent_match=writer|rewriter", "algorithm.advantage=rloo",
    )  # fmt: skip
    assert only_writer.returncode == 0, only_writer.stderr
    data = json.loads(only_writer.stdout)
    assert (data["settings"]["agent_match"], data["settings"]["advantage"]) == ("writer|rewriter", "rloo")
    assert [t["agent_name"] for t in data["transitions"]] == ["writer"]
    # RLOO over a group of two: each rollout's advantage is its reward minus the other's.
    assert data["transitions"][0]["advantage"] == pytest.approx(1.0)


def test_transitions_take_the_config_then_the_overrides(run: Run, tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text("agent:\n  entrypoint: some.agent:run\nadapter:\n  agent_match: checker\n  credit: last\n")
    shown = alight(
        "trace", str(run.dir / "store.db"), "--rollout", run.rollout_ids[1], "--transitions",
        "--config", str(config), "algorithm.advantage=reinforce_pp",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "credit last" in shown.stdout and "advantage reinforce_pp" in shown.stdout
    assert "agent_match checker" in shown.stdout
    rows = [line for line in shown.stdout.splitlines() if "│" in line]
    assert [line.split("│")[2].strip() for line in rows] == ["checker"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--transitions", "adapter.agent_mtch=x"], "agent_mtch"),
        (["--transitions", "adapter.credit=sideways"], "sideways"),
        (["--transitions", "--config", "no/such.yaml"], "does not exist"),
        (["adapter.agent_match=writer"], "apply to --transitions only"),
        (["--config", "configs/calc.yaml"], "apply to --transitions only"),
    ],
)
def test_bad_settings_fail_in_one_line_with_exit_2(run: Run, args: list[str], expected: str) -> None:
    done = alight("trace", str(run.dir), "--rollout", run.rollout_ids[0], *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and done.stderr.strip().count("\n") == 0, done.stderr
    assert expected in done.stderr and "trace_defaults" not in done.stderr


def test_transitions_need_a_rollout(run: Run) -> None:
    done = alight("trace", str(run.dir), "--transitions")
    assert done.returncode == 2 and "needs --rollout" in done.stderr
