"""Command agents through the CLI as a user runs them: `alight dev` and a short `alight train` with
agents that are not Python (examples/node_agent in Node.js, examples/shell_agent in POSIX shell),
against the real stack (store server, proxy, tiny embedded model, runner pool)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.adapters import SpanAdapter
from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, SpanKind

REPO = Path(__file__).resolve().parents[2]
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")


def alight(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


async def spans_and_attempts(run_dir: Path) -> list[tuple[Any, list[Any], list[Any]]]:
    """(rollout, its last attempt's spans, its attempts) for every rollout of a run's store."""
    store = SqliteStore(run_dir / "store.db")
    try:
        out = []
        for rollout in await store.list_rollouts():
            out.append(
                (rollout, await store.query_spans(rollout.rollout_id), await store.list_attempts(rollout.rollout_id))
            )
        return out
    finally:
        await store.close()


def check_llm_calls_nest_under_the_agent(spans: list[Any], agent: str) -> int:
    """Every LLM span is a child of the attempt's agent span and names the agent; the adapter with
    `agent_match=agent` selects each of them. Returns how many there are."""
    [agent_span] = [s for s in spans if s.kind is SpanKind.AGENT]
    calls = [s for s in spans if s.kind is SpanKind.LLM]
    assert agent_span.name == agent
    for call in calls:
        assert call.attributes[semconv.AGENT_NAME] == agent
        assert (call.parent_id, call.trace_id) == (agent_span.span_id, agent_span.trace_id)
        assert call.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
    adapted = SpanAdapter(agent_match=agent).adapt(spans, rollout_id=spans[0].rollout_id, reward=0.0)
    assert len(adapted.transitions) == len(calls)
    assert not SpanAdapter(agent_match="other").adapt(spans, rollout_id=spans[0].rollout_id, reward=0.0).transitions
    return len(calls)


WRAPPER = """#!/bin/sh
# ok: the shell example (curl to the proxy, reward file); crash: exit 3 with a message; sleep: past the limit
case "$(cat "$ALIGHT_TASK_FILE")" in
  *crash*) echo "agent.sh: cannot parse the question" >&2; exit 3 ;;
  *sleep*) sleep 60 ;;
  *) exec {repo}/examples/shell_agent/agent.sh ;;
esac
"""


@pytest.mark.slow
@pytest.mark.anyio
async def test_dev_runs_a_shell_agent_and_handles_its_crash_and_its_timeout(tmp_path: Path) -> None:
    wrapper = tmp_path / "agent.sh"
    wrapper.write_text(WRAPPER.format(repo=REPO))
    wrapper.chmod(0o755)
    data = tmp_path / "tasks.jsonl"
    rows = [
        {"question": "Mia buys 21 bags of 26 apples. How many apples?", "result": "546"},
        {"question": "crash", "result": "0"},
        {"question": "sleep", "result": "0"},
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = alight(
        "dev", "configs/calc_node.yaml", "--json", "--n", "3", f"agent.command={wrapper}", "agent.name=calc",
        f"data.val={data}", f"trainer.output_dir={tmp_path / 'runs'}", "runner.n_runners=3",
        "runner.timeout_s=3", "runner.max_attempts=1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    by_question = {r["task"]["question"]: r for r in report["rollouts"]}
    ok, crash, sleep = (by_question[row["question"]] for row in rows)
    assert ok["status"] == "succeeded" and ok["reward"] in (0.0, 1.0) and ok["llm_calls"] == 1
    assert crash["status"] == "failed" and crash["error"] == "agent.sh: cannot parse the question"
    assert sleep["status"] == "timeout"
    stored = {r.task.input["question"]: (spans, attempts) for r, spans, attempts in await spans_and_attempts(
        Path(report["run_dir"]))}  # fmt: skip
    assert check_llm_calls_nest_under_the_agent(stored[rows[0]["question"]][0], "calc") == 1
    [crashed] = stored["crash"][1]
    assert crashed.error is not None and "exited with code 3" in crashed.error
    [timed_out] = stored["sleep"][1]
    assert timed_out.status is AttemptStatus.TIMEOUT


@needs_node
@pytest.mark.slow
@pytest.mark.anyio
async def test_train_a_node_agent_for_two_steps(tmp_path: Path) -> None:
    done = alight(
        "train", "configs/calc_node.yaml", "--no-dashboard", f"trainer.output_dir={tmp_path}",
        "trainer.steps=2", "warm_start.steps=0", "trainer.batch_size=2", "trainer.group_size=2",
        "data.train_size=8", "data.val=null", "runner.n_runners=2", "logging.plot=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "train/reward_mean" in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["rollouts/succeeded"] == 4 and s["transitions"] >= 4 for s in steps)  # agent_match: calc
    rollouts = await spans_and_attempts(run_dir)
    assert len(rollouts) == 8
    for rollout, spans, _ in rollouts:
        assert rollout.reward in (0.0, 1.0)  # the last line of the program's stdout
        assert check_llm_calls_nest_under_the_agent(spans, "calc") >= 1


def test_a_bad_command_fails_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    for override, named in [
        ("agent.command=no-such-program-xyz", "no-such-program-xyz"),
        ("agent.entrypoint=recipes/calc/agent.py:solve", "exactly one of agent.entrypoint"),
    ]:
        done = alight("dev", "configs/calc_node.yaml", override, f"trainer.output_dir={tmp_path}")
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
        assert not list(tmp_path.iterdir())
