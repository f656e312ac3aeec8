"""reward.kind=judge as a user runs it: `alight dev` in a subprocess, the whole stack (store server,
proxy, a pool of two runner processes), the judge's cache file in the run directory, exit codes.

The scripted OpenAI-compatible server stands in for a competent model (no model here can judge):
it plays the calculator agent's model and, asked as the judge through the proxy (`model: policy`),
gives "Score: 7/10" to the right answer.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from alight.rewards.judge_cache import CACHE_FILE
from tests.cli.test_dev_and_trace import alight
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer
from tests.fixtures.sample_agents import calculator_script


def _is_judgement(request: dict[str, Any]) -> bool:
    return "judge" in str(request["messages"][0]["content"])


def policy_and_judge(request: dict[str, Any]) -> dict[str, Any]:
    if _is_judgement(request):
        return answer("Score: 7/10" if "The answer is 3" in request["messages"][-1]["content"] else "Score: 0/10")
    return calculator_script(request)


def write_config(tmp_path: Path, reward: str) -> Path:
    data = tmp_path / "questions.jsonl"
    data.write_text((json.dumps({"question": "What is 1 + 2?"}) + "\n") * 4)  # one task, asked four times
    config = tmp_path / "exp.yaml"
    config.write_text(
        f"""name: judged
trainer:
  output_dir: {tmp_path / "runs"}
agent:
  entrypoint: tests.fixtures.sample_agents:calculator
data:
  train: {data}
runner:
  n_runners: 2
  timeout_s: 60
engine:
  sampling:
    max_tokens: 16
{reward}"""
    )
    return config


JUDGE = """reward:
  kind: judge
  judge:
    model: policy
    rubric: "Question: {task}\\nAnswer: {answer}\\nIs the answer right?"
    task_field: question
"""


@pytest.mark.slow
def test_dev_with_a_policy_judge_replaces_the_agents_reward_and_shares_its_cache(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(policy_and_judge) as upstream:
        done = alight(
            "dev", str(write_config(tmp_path, JUDGE)), "--all", "--endpoint", upstream.url, "--model", "scripted",
            "--run-dir", str(run_dir), "--json",
        )  # fmt: skip
        judgements = [r for r in upstream.requests if _is_judgement(r.body)]
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    # The calculator returns 1.0 itself; the judge's 7/10 replaces it.
    assert [(row["status"], row["reward"]) for row in rows] == [("succeeded", 0.7)] * 4, rows
    # Four identical judgements: asked at most once per runner process, the rest from the shared file.
    assert 1 <= len(judgements) <= 2
    assert (
        judgements[0].body["messages"][1]["content"]
        == "Question: What is 1 + 2?\nAnswer: The answer is 3\nIs the answer right?"
    )
    with sqlite3.connect(run_dir / CACHE_FILE) as db:
        assert db.execute("SELECT score FROM judge_scores").fetchall() == [(7.0,)]


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        ("reward:\n  kind: jury\n", "reward.kind must be one of agent, tests, judge, got 'jury'"),
        ('reward:\n  kind: judge\n  judge:\n    rubric: "Rate {task}"\n', "must contain the placeholder {answer}"),
        ("reward:\n  kind: judge\n  judge:\n    max_score: -1\n", "reward.judge.max_score must be a positive number"),
    ],
)
def test_bad_reward_settings_fail_in_one_line_before_anything_starts(
    tmp_path: Path, reward: str, expected: str
) -> None:
    done = alight(
        "dev", str(write_config(tmp_path, reward)), "--endpoint", "http://127.0.0.1:9/v1", "--model", "x", timeout=60
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
