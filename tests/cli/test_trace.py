"""`alight trace` on a hand-made run: `--transitions` with the config's settings and Hydra overrides,
bad input as one line with exit code 2, and model output that is not printable text shown escaped."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, Rollout, Task
from tests.adapters.factory import Trace
from tests.cli.in_process import alight_here

REPO = Path(__file__).resolve().parents[2]


def alight(*args: str) -> subprocess.CompletedProcess[str]:
    """`alight trace` reads a store and prints: in this process (test_dev_and_trace.py runs it as a subprocess)."""
    return alight_here(*args)


#: What an untrained model may answer: escape sequences, control characters, invisible format characters.
NOISE = "\x1b[31mred\x07 bell\x00 nul\x7f del\u202e rtl\u200b zwsp \U000e0041 tag [/] [bold]markup?"


@dataclass
class Run:
    dir: Path
    rollout_ids: list[str]  # a group of two
    noisy_id: str  # a rollout whose spans hold NOISE


async def _record(db: Path) -> tuple[list[str], str]:
    """A group of two rollouts (rewards 1 and 0), each a writer call, a checker call and a reward;
    then one rollout whose task, agent, model answer, tool call and error hold NOISE."""
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
        [noisy] = await store.enqueue([Rollout(task=Task(input={"q": NOISE}))])
        claim = await store.dequeue("w")
        assert claim is not None
        trace = Trace(noisy.rollout_id, claim.attempt.attempt_id)
        trace.llm([1, 2], [3], agent=NOISE, reply={"role": "assistant", "content": NOISE})
        trace.tool(NOISE, agent=NOISE).attributes.update({"tool.arguments": NOISE, "tool.output": NOISE})
        trace.reward(0.0, name=NOISE)
        await store.add_spans(trace.spans)
        error = f"Traceback (most recent call last):\nValueError: {NOISE}"
        await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.FAILED, error=error)
        return [r.rollout_id for r in queued], noisy.rollout_id
    finally:
        await store.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run_dir = tmp_path_factory.mktemp("run")
    group, noisy = asyncio.run(_record(run_dir / "store.db"))
    return Run(run_dir, group, noisy)


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


def _unprintable(text: str) -> set[str]:
    return {c for line in text.splitlines() for c in line if not c.isprintable()}


def test_model_output_that_is_not_printable_is_shown_escaped(run: Run) -> None:
    for args in (
        ["--rollout", run.noisy_id],
        ["--rollout", run.noisy_id, "--transitions"],
        [],
    ):
        shown = alight("trace", str(run.dir), *args)
        assert shown.returncode == 0, (args, shown.stderr)
        assert _unprintable(shown.stdout) == set(), (args, shown.stdout)
        if args:
            assert "\\x1b[31mred\\x07 bell\\x00 nul\\x7f del\\u202e rtl" in shown.stdout, shown.stdout
    tree = alight("trace", str(run.dir), "--rollout", run.noisy_id).stdout
    assert "[/] [bold]markup?" in tree  # shown as written, not read as Rich markup


def test_json_output_stays_valid_json_with_the_raw_text(run: Run) -> None:
    shown = alight("trace", str(run.dir), "--rollout", run.noisy_id, "--json")
    assert shown.returncode == 0, shown.stderr
    spans = json.loads(shown.stdout)["spans"]
    assert spans[0]["attributes"]["llm.response.message"]["content"] == NOISE
    assert json.loads(shown.stdout)["rollout"]["task"]["input"] == {"q": NOISE}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é ✓ 字", "plain text, é ✓ 字"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\tb\nc\r", "a\\x09b\\x0ac\\x0d"),
        ("\x7f\x85", "\\x7f\\x85"),
        ("zero\u200bwidth \u202eoverride", "zero\\u200bwidth \\u202eoverride"),
        ("\U000e0041", "\\U000e0041"),
    ],
)
def test_printable_escapes_what_a_terminal_would_not_show_as_itself(text: str, shown: str) -> None:
    from alight.cli.trace_render import printable

    assert printable(text) == shown
    assert printable(shown) == shown  # escaping twice changes nothing
