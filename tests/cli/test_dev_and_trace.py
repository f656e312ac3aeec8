"""`alight dev` and `alight trace` as a user runs them: subprocesses, exit codes, real stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.in_process import alight_here
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.sample_agents import calculator_script

REPO = Path(__file__).resolve().parents[2]


def alight(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    path = f"{REPO / 'src'}{os.pathsep}{REPO}"  # this checkout's code (whichever is installed), then tests.*
    env = {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def write_config(tmp_path: Path, *, entrypoint: str = "tests.fixtures.sample_agents:calculator", **extra: str) -> Path:
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?"}) + "\n" for i in range(5)))
    lines = [
        "name: devtest",
        "trainer:",
        f"  output_dir: {tmp_path / 'runs'}",
        "agent:",
        f"  entrypoint: {entrypoint}",
        "data:",
        f"  train: {data}",
        "runner:",
        "  n_runners: 2",
        "  timeout_s: 60",
        "engine:",
        "  sampling:",
        "    max_tokens: 16",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path = tmp_path / "exp.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_dev_against_an_endpoint_then_trace_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(calculator_script) as upstream:
        done = alight(
            "dev", str(write_config(tmp_path)), "--n", "3", "--endpoint", upstream.url, "--model", "scripted",
            "--run-dir", str(run_dir), "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["run_dir"] == str(run_dir)
    rows = report["rollouts"]
    assert len(rows) == 3
    for row in rows:
        assert (row["status"], row["reward"], row["llm_calls"], row["tool_calls"]) == ("succeeded", 1.0, 2, 1), row

    listed = alight("trace", str(run_dir), "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["rollout_id"] for r in json.loads(listed.stdout)["rollouts"]} == {r["rollout_id"] for r in rows}

    rollout_id = rows[0]["rollout_id"]
    tree = alight("trace", str(run_dir), "--rollout", rollout_id)
    assert tree.returncode == 0, tree.stderr
    for shown in (rollout_id, "llm.chat", "[calculator]", "add", "reward", "succeeded"):
        assert shown in tree.stdout, (shown, tree.stdout)

    otlp_file = tmp_path / "spans.json"
    detail = alight("trace", str(run_dir), "--rollout", rollout_id, "--json", "--otlp", str(otlp_file))
    spans = json.loads(detail.stdout)["spans"]
    exported = json.loads(otlp_file.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["spanId"] for s in exported] == [s["span_id"] for s in spans]


@pytest.mark.slow
def test_dev_with_the_embedded_tiny_model(tmp_path: Path) -> None:
    done = alight("dev", str(write_config(tmp_path)), "--n", "2", "runner.n_runners=1")
    assert done.returncode == 0, done.stderr
    assert "alight dev" in done.stdout and "succeeded" in done.stdout
    assert "alight trace" in done.stdout
    for bar in ("Loading weights", "Writing model shards", "it/s]"):  # transformers' tqdm bars stay off
        assert bar not in done.stdout + done.stderr, done.stderr


def test_otlp_export_loads_back_through_the_store_receiver(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from alight.store.memory import MemoryStore
    from alight.store.otlp_export import spans_to_otlp_json
    from alight.store.server import StoreServer
    from alight.types import Rollout, Span, SpanKind, Task

    async def setup(store: MemoryStore) -> tuple[str, str]:
        [rollout] = await store.enqueue([Rollout(task=Task(input=1))])
        claim = await store.dequeue()
        assert claim is not None
        return rollout.rollout_id, claim.attempt.attempt_id

    store = MemoryStore()
    rid, aid = asyncio.run(setup(store))
    spans = [
        Span(rollout_id=rid, attempt_id=aid, sequence_id=1, name="llm.chat", kind=SpanKind.LLM,
             attributes={"llm.request.messages": [{"role": "user", "content": "hi"}], "alight.agent.name": "a"}),
        Span(rollout_id=rid, attempt_id=aid, sequence_id=2, name="reward", kind=SpanKind.REWARD,
             attributes={"reward.value": 0.5}),
    ]  # fmt: skip
    with StoreServer(store) as server:
        answer = httpx.post(f"{server.url}/v1/traces", json=spans_to_otlp_json(spans), timeout=10)
        assert answer.status_code == 200, answer.text
        stored = asyncio.run(_spans_over_http(server.url, rid))
    assert [(s.name, s.kind, s.span_id) for s in stored] == [(s.name, s.kind, s.span_id) for s in spans]
    assert stored[0].attributes["llm.request.messages"] == [{"role": "user", "content": "hi"}]
    assert stored[1].attributes["reward.value"] == 0.5


async def _spans_over_http(url: str, rollout_id: str) -> list:  # type: ignore[type-arg]
    from alight.store.client import StoreClient

    async with StoreClient(url) as client:
        return await client.query_spans(rollout_id)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_module", "no module named"),
        ("bad_signature", "is not one alight can pass"),
        ("missing_data", "does not exist"),
        ("unreachable", "does not answer"),
        ("bad_override", "nrunners"),
    ],
)
def test_bad_input_fails_in_one_line_before_any_worker_starts(tmp_path: Path, case: str, expected: str) -> None:
    agent_file = tmp_path / "agent.py"
    agent_file.write_text("def solve(task, temperature):\n    return 1.0\n")
    args: list[str] = []
    if case == "no_module":
        config = write_config(tmp_path, entrypoint="no_such_package.agent:solve")
    elif case == "bad_signature":
        config = write_config(tmp_path, entrypoint=f"{agent_file}:solve")
    elif case == "missing_data":
        config = write_config(tmp_path)
        args = [f"data.train={tmp_path / 'nope.jsonl'}"]
    elif case == "unreachable":
        config = write_config(tmp_path)
        args = ["--endpoint", "http://127.0.0.1:9/v1", "--model", "x"]
    else:
        config = write_config(tmp_path)
        args = ["runner.nrunners=2"]
    done = alight_here("dev", str(config), *args)  # in this process: refused before anything starts
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


@pytest.mark.slow
def test_dev_cancels_rollouts_still_running_at_its_time_limit(tmp_path: Path) -> None:
    agent_file = tmp_path / "sleepy.py"
    agent_file.write_text("import time\n\ndef solve(task):\n    time.sleep(600)\n    return 1.0\n")
    config = write_config(tmp_path, entrypoint=f"{agent_file}:solve")
    started = time.monotonic()
    done = alight("dev", str(config), "--n", "1", "--json", "dev.timeout_s=3", "runner.heartbeat_timeout_s=600")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["rollouts"]
    assert row["status"] == "cancelled"
    assert time.monotonic() - started < 300  # the agent sleeps 600 s: dev cancelled it, however busy the machine
