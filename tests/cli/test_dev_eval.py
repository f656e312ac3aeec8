"""`alight dev --split S --all --model M`: evaluating a model on a whole split, as a user says
"the reward went from A to B" (the mean reward and each task's, as a table or one JSON object)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from alight.commands.dev import run_dev, served_model, with_endpoint, with_temperature
from alight.config import load_config, to_object
from alight.errors import ConfigError
from alight.trainer.tasks import dev_rows
from tests.cli.test_dev_and_trace import alight
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call


def even_right_script(request: dict[str, Any]) -> dict[str, Any]:
    """Stands in for a model (a test fixture): calls `add`, then answers 3 (right: the fixture agent
    scores a "3") for questions about an even number and 4 (wrong) for odd ones."""
    if not any(m["role"] == "tool" for m in request["messages"]):
        return tool_call("add", {"a": 1, "b": 2})
    question = next(m["content"] for m in request["messages"] if m["role"] == "user")
    number = int(re.findall(r"\d+", question)[0])
    return answer("The answer is 3" if number % 2 == 0 else "The answer is 4")


def write_eval_config(tmp_path: Path, *, train_rows: int = 7, val_rows: int = 5, extra: str = "") -> Path:
    for split, count in (("train", train_rows), ("val", val_rows)):
        rows = "".join(json.dumps({"question": f"What is {i} + 2?"}) + "\n" for i in range(count))
        (tmp_path / f"{split}.jsonl").write_text(rows)
    path = tmp_path / "eval.yaml"
    path.write_text(
        f"name: evaltest\ntrainer:\n  output_dir: {tmp_path / 'runs'}\n"
        "agent:\n  entrypoint: tests.fixtures.sample_agents:calculator\n"
        f"data:\n  train: {tmp_path / 'train.jsonl'}\n  val: {tmp_path / 'val.jsonl'}\n"
        "runner:\n  n_runners: 2\n  timeout_s: 60\nengine:\n  sampling:\n    max_tokens: 16\n" + extra
    )
    return path


def cfg_of(path: Path, *overrides: str) -> Any:
    return to_object(load_config(path, list(overrides)))


@pytest.mark.slow
def test_dev_all_evaluates_every_task_of_the_split_with_the_exact_mean_reward(tmp_path: Path) -> None:
    config = write_eval_config(tmp_path)
    with ScriptedOpenAIServer(even_right_script) as upstream:
        done = alight(
            "dev", str(config), "--split", "val", "--all", "--endpoint", upstream.url, "--model", "scripted",
            "--json",
        )  # fmt: skip
        table = alight("dev", str(config), "--split", "train", "--all", "--endpoint", upstream.url)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["split"], report["tasks"], report["succeeded"]) == ("val", 5, 5)
    assert report["mean_reward"] == pytest.approx(3 / 5)  # questions 0, 2, 4 right; 1, 3 wrong
    by_question = {r["task"]["question"]: r["reward"] for r in report["rollouts"]}
    assert by_question == {f"What is {i} + 2?": float(i % 2 == 0) for i in range(5)}
    assert report["model"] == "openai/scripted"

    assert table.returncode == 0, table.stderr
    assert re.search(r"mean reward 0\.5714 over 7 train tasks \(7 succeeded", table.stdout), table.stdout  # 4 of 7


@pytest.mark.slow
def test_dev_model_runs_the_newest_checkpoint_of_a_training_run(tmp_path: Path, tiny_dir: Path) -> None:
    run_dir = tmp_path / "run"
    for step in (1, 2):  # two checkpoints as training writes them; the newer one is evaluated
        shutil.copytree(tiny_dir, run_dir / "checkpoints" / f"step_{step:06d}")
    newest = run_dir / "checkpoints" / "step_000002"
    (newest / "config.json").touch()
    config = write_eval_config(tmp_path, val_rows=2)
    done = alight(
        "dev", str(config), "--all", "--split", "val", "--model", str(run_dir), "--temperature", "0", "--json",
        "runner.n_runners=1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"] == str(newest)
    assert report["tasks"] == 2 and report["succeeded"] == 2, report


def test_dev_all_with_n_is_a_one_line_error(tmp_path: Path) -> None:
    done = alight("dev", str(write_eval_config(tmp_path)), "--all", "--n", "3")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --all runs every task of the split: drop --n"], done.stderr


def test_all_rows_are_the_rows_training_validates_on(tmp_path: Path) -> None:
    cfg = cfg_of(write_eval_config(tmp_path, val_rows=9), "data.val_size=6", "trainer.val_size=4")
    split, tasks = dev_rows(cfg, None, "val")
    assert split == "val"
    assert [t["question"] for t in tasks] == [f"What is {i} + 2?" for i in range(4)]
    split, tasks = dev_rows(cfg, None, "train")
    assert (split, len(tasks)) == ("train", 7)
    assert len(dev_rows(cfg, 2, "train")[1]) == 2


def test_split_and_model_errors_are_one_line(tmp_path: Path) -> None:
    cfg = cfg_of(write_eval_config(tmp_path))
    with pytest.raises(ConfigError, match="unknown split 'test'; choose train or val"):
        dev_rows(cfg, None, "test")
    no_val = cfg_of(write_eval_config(tmp_path), "data.val=null")
    with pytest.raises(ConfigError, match=r"the config names no val data \(data.val\)"):
        dev_rows(no_val, None, "val")
    assert dev_rows(no_val, 2, None)[0] == "train"  # without --split, dev falls back to the split there is
    with pytest.raises(ConfigError, match="no model at"):
        served_model(cfg, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="--temperature must be 0 or more"):
        with_temperature(cfg, -1.0)
    with pytest.raises(ConfigError, match="drop --n"):
        run_dev(cfg, n=2, all_rows=True)
    assert not (tmp_path / "runs").exists()  # nothing was written for a refused run


def test_model_without_endpoint_keeps_the_engine_and_resolves_checkpoints(
    tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cfg_of(write_eval_config(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert served_model(cfg, "tiny") == str(tmp_path / "cache" / "alight" / "tiny")  # resolved once, here
    assert served_model(cfg, str(tiny_dir)) == str(tiny_dir)
    assert with_endpoint(cfg, None, str(tiny_dir)) is cfg  # the config is not rewritten: the stack is handed the model
    litellm = cfg_of(write_eval_config(tmp_path), "engine.kind=litellm", "engine.model=openai/a")
    assert served_model(litellm, "openai/b") == "openai/b"  # a LiteLLM string, not a path
    assert with_temperature(cfg, 0.0).engine.sampling.temperature == 0.0
