"""`alight eval`: models side by side on the same tasks through the real stack (store, proxy,
engine, runner processes), `n` samples each; the command's pass@k, interval and paired difference
must match an independent computation from the rewards its stores recorded."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from alight.store.sqlite import SqliteStore
from tests.cli.in_process import alight_here
from tests.cli.test_dev_and_trace import alight
from tests.cli.test_dev_eval import even_right_script, write_eval_config
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call
from tests.trainer.test_fit_calc import CALC

#: A short calc run that still learns the tool-call format: a warm start on demonstrations that
#: always call the tool, one GRPO step, checkpoints at steps 0 (the warm start) and 1.
SHORT_CALC = [
    "warm_start.steps=60",
    "warm_start.warmup_steps=10",
    "warm_start.size=400",
    "warm_start.batch_size=8",
    "warm_start.generator_kwargs.tool_rate=1.0",
    "trainer.steps=1",
    "trainer.batch_size=2",
    "trainer.group_size=2",
    "trainer.val_every=0",
    "trainer.save_every=1",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=128",  # a tool call takes ~100 tokens of the byte-level tokenizer
    "logging.dashboard=false",
]


async def _store_rewards(db: Path) -> tuple[dict[str, list[float]], int]:
    store = SqliteStore(db)
    try:
        out: dict[str, list[float]] = {}
        failed = 0
        for rollout in await store.list_rollouts():
            ok = rollout.status.value == "succeeded"
            failed += not ok
            out.setdefault(json.dumps(rollout.task.input, sort_keys=True), []).append((rollout.reward or 0.0) * ok)
        return out, failed
    finally:
        await store.close()


def store_rewards(report: dict[str, Any]) -> list[tuple[dict[str, list[float]], int]]:
    """Per model, each task's rewards as its own store recorded them (keyed by the task's JSON; a
    failed rollout 0) and how many rollouts failed."""
    return [asyncio.run(_store_rewards(Path(m["run_dir"]) / "store.db")) for m in report["models"]]


def enumerated_pass_at_k(samples: list[float], k: int, success: float) -> float:
    subsets = list(itertools.combinations(samples, k))
    return sum(any(r >= success for r in s) for s in subsets) / len(subsets)


def check_against_the_stores(report: dict[str, Any]) -> list[list[float]]:
    """Recompute the report from the stores: per-task rewards, pass@k over every k-subset, the
    bootstrap interval and the paired difference redrawn with numpy from the report's seed.
    Returns each model's per-task mean rewards."""
    n, seed, resamples, success = report["n"], report["seed"], report["resamples"], report["success"]
    recorded = store_rewards(report)
    tasks = [json.dumps(row["task"], sort_keys=True) for row in report["per_task"]]
    draws = np.random.default_rng(seed).integers(0, len(tasks), size=(resamples, len(tasks)))
    means = []
    for model, (rewards, failed) in zip(report["models"], recorded, strict=True):
        assert sorted(rewards) == sorted(tasks) and all(len(rewards[t]) == n for t in tasks)
        for row in report["per_task"]:
            key = json.dumps(row["task"], sort_keys=True)
            assert sorted(row["rewards"][model["label"]]) == sorted(rewards[key])
        for k in report["k"]:
            expected = np.mean([enumerated_pass_at_k(rewards[t], k, success) for t in tasks])
            assert model["pass_at_k"][str(k)] == pytest.approx(expected), (model["label"], k)
        per_task = np.array([np.mean(rewards[t]) for t in tasks])
        boot = np.array([per_task[row].mean() for row in draws])
        low, high = np.quantile(boot, [0.025, 0.975], method="inverted_cdf")
        assert model["mean_reward"] == pytest.approx({"value": per_task.mean(), "low": low, "high": high})
        assert model["failed"] == failed
        means.append(per_task)
    for model, per_task in zip(report["models"][1:], means[1:], strict=True):
        diffs = np.array([per_task[row].mean() - means[0][row].mean() for row in draws])
        low, high = np.quantile(diffs, [0.025, 0.975], method="inverted_cdf")
        share = float(np.mean(diffs <= 0))
        wanted = {"value": per_task.mean() - means[0].mean(), "low": low, "high": high, "share_not_better": share}
        assert model["difference"] == pytest.approx(wanted), model["label"]
    assert report["models"][0]["difference"] is None
    return [list(m) for m in means]


class Alternating:
    """Stands in for a sampled model (a test fixture): calls `add`, then answers right ("3") on every
    other conversation and wrong ("4") on the rest, so a task's samples disagree."""

    def __init__(self) -> None:
        self.answers = itertools.count()
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in request["messages"]):
            return tool_call("add", {"a": 1, "b": 2})
        with self.lock:
            turn = next(self.answers)
        return answer("The answer is 3" if turn % 2 == 0 else "The answer is 4")


@pytest.mark.slow
def test_eval_compares_two_endpoints_with_pass_at_k_and_a_paired_interval(tmp_path: Path) -> None:
    """Two scripted models (test fixtures) on 6 val tasks, 4 samples each: one right on even
    questions only, one right on every other answer; the JSON matches the stores' rewards."""
    config = write_eval_config(tmp_path, val_rows=6)
    with ScriptedOpenAIServer(even_right_script) as even, ScriptedOpenAIServer(Alternating()) as coin:
        done = alight(
            "eval", str(config), "--model", even.url, "--model", f"coin@{coin.url}", "--split", "val", "--n", "4",
            "--k", "1,2,4", "--temperature", "0.7", "--seed", "3", "--resamples", "30", "--json",
        )  # fmt: skip
        table = alight("eval", str(config), "--model", even.url, "--split", "val", "--per-task", "--temperature", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["source"], report["tasks"], report["n"], report["k"]) == ("val", 6, 4, [1, 2, 4])
    assert report["temperature"] == 0.7 and report["baseline"] == even.url
    first, second = report["models"]
    assert (first["model"], second["model"]) == (
        "openai/policy",
        "openai/coin",
    )  # engine.served_name, then the name given
    assert first["pass_at_k"] == {"1": 0.5, "2": 0.5, "4": 0.5}  # tasks 0, 2, 4 always right, 1, 3, 5 never
    assert first["failed"] == second["failed"] == 0 and first["rollouts"] == 24
    assert sum(sum(r["rewards"]["coin@" + coin.url]) for r in report["per_task"]) == 12  # every other answer
    means = check_against_the_stores(report)
    assert means[0] == [1.0, 0.0] * 3

    assert table.returncode == 0, table.stderr
    assert "alight eval: 6 tasks of val, n=1, temperature 0" in table.stdout, table.stdout
    assert "0.500 [" in table.stdout and "per task" in table.stdout


def test_eval_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = str(write_eval_config(tmp_path))
    (tmp_path / "empty.jsonl").write_text("")
    cases = {
        ("--model", str(tmp_path / "missing")): "no model at",
        ("--n", "2", "--k", "3", "--temperature", "1"): "--k 3: pass@k needs 1 <= k <= n samples per task (--n 2)",
        ("--n", "2", "--temperature", "0"): "--n 2 samples per task at temperature 0 are all the same answer",
        ("data.val_size=0", "--split", "val"): "val.jsonl' holds no rows",  # an empty split
        ("--tasks", str(tmp_path / "empty.jsonl")): "empty.jsonl: cannot load",
        ("--tasks", str(tmp_path / "none.jsonl")): "no such file",
        ("--split", "val", "--tasks", str(tmp_path / "empty.jsonl")): "give --split or --tasks, not both",
        ("--split", "test"): "unknown split 'test'",
        ("--k", "a,b"): "--k 'a,b': give whole numbers",
        ("--model", "@http://127.0.0.1:9/v1"): "name the model before '@'",
        ("--model", "http://127.0.0.1:9/v1"): "endpoint http://127.0.0.1:9/v1 does not answer",
    }
    for args, message in cases.items():
        done = alight_here("eval", config, *args)  # in this process: refused before anything starts
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, done.stderr)
    assert not (tmp_path / "runs").exists()  # nothing ran for refused input


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_on_calc_warm_start_against_the_trained_run(tmp_path: Path) -> None:
    """The tiny model warm-started by a short calc run (its step-0 checkpoint) against the run
    itself (its newest checkpoint), 4 samples on each of 4 val tasks through the embedded engine:
    the JSON's pass@k, intervals and paired difference match a recomputation from the stores."""
    output = f"trainer.output_dir={tmp_path / 'runs'}"
    trained = alight("train", str(CALC), *SHORT_CALC, output, "--json", timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = Path(json.loads(trained.stdout.strip().splitlines()[-1])["run_dir"])
    warm = run_dir / "checkpoints" / "step_000000"
    done = alight(
        "eval", str(CALC), "data.val_size=4", "runner.n_runners=2", "engine.sampling.max_tokens=128", output,
        "--split", "val", "--n", "4", "--k", "1,2,4", "--temperature", "1", "--seed", "11",
        "--model", str(warm), "--model", str(run_dir), "--json", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["source"], report["tasks"], report["n"], report["seed"]) == ("val", 4, 4, 11)
    assert [m["model"] for m in report["models"]] == [str(warm), str(run_dir / "checkpoints" / "step_000001")]
    assert [row["name"] for row in report["per_task"]] == [row["task"]["id"] for row in report["per_task"]]
    means = check_against_the_stores(report)
    assert any(reward > 0 for task_means in means for reward in task_means), means  # pass@k is not trivially 0


def test_model_specs_ks_and_task_names() -> None:
    from alight.commands.evaluation import parse_ks, parse_model, task_name
    from alight.errors import ConfigError

    assert parse_model("http://h:8000/v1") == ("http://h:8000/v1", None)
    assert parse_model("Qwen/Qwen2.5-1.5B@https://h/v1") == ("https://h/v1", "Qwen/Qwen2.5-1.5B")
    assert parse_model("runs/calc-1") == (None, "runs/calc-1")
    assert parse_ks(None, 1) == [1] and parse_ks(None, 8) == [1, 8] and parse_ks("4, 1,4", 4) == [1, 4]
    with pytest.raises(ConfigError, match="--k 0"):
        parse_ks("0,1", 4)
    assert task_name({"instance_id": "a__b-1", "id": 3}, 0) == "a__b-1"
    assert task_name({"question": "q"}, 2) == "#2" and task_name("plain", 5) == "#5"
