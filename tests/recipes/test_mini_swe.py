"""The mini-swe-agent recipe (recipes/mini_swe/, configs/mini_swe.yaml): mini-swe-agent's own CLI,
unchanged, run as a command agent in a local sandbox per attempt on the SWE-style tasks, the hidden
tests deciding the reward.

The model is a test fixture: a scripted OpenAI-compatible server (tests.fixtures.openai_server)
behind the real LiteLLM engine and the real alight proxy, playing a competent model: it answers
mini's first turn with one ```bash block that edits the file with a python/sed one-liner and its
second with the submit command mini expects (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). A
second script makes a wrong edit. Everything between (mini-swe-agent, LiteLLM inside it, the
sandbox, the proxy, the store, the runner pool, the tests reward) is real.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.config import load_config, to_object
from alight.entrypoints import resolve_entrypoint
from alight.types import Rollout, RolloutStatus, Span, SpanKind, Task
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer
from tests.recipes.train_runs import check_two_steps_of_train

pytest.importorskip("minisweagent", reason="the mini-swe extra runs mini-swe-agent")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "mini_swe.yaml"
RUN = REPO / "recipes" / "mini_swe" / "run.py"
make_tasks = resolve_entrypoint(f"{REPO / 'recipes/swe_tasks/data.py'}:make_tasks")
SUBMIT = answer("THOUGHT: the fix is in, so I submit.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
#: The first reply per task: the pager fix (right: every hidden test passes) and a slug edit that
#: collapses dashes but leaves them at the ends (wrong: 5 of textkit's 7 hidden tests pass).
EDITS = {
    "Last page missing": "python -c \"import pathlib; p = pathlib.Path('pager/pages.py'); "
    "p.write_text(p.read_text().replace('return len(self.items) // self.per_page', "
    "'return -(-len(self.items) // self.per_page)'))\"",
    "slugify leaves repeated": 'sed -i \'s/    text = _UNSAFE.sub("", text)/    text = re.sub("-+", "-", '
    '_UNSAFE.sub("", text))/\' textkit/slug.py',
}
EXPECTED = {"pager__pager-7": 1.0, "textkit__textkit-101": 5 / 7}
PASSED = {"pager__pager-7": 6, "textkit__textkit-101": 5}


def competent_model(request: dict[str, Any]) -> dict[str, Any]:
    """mini's first turn gets the task's edit, the next one the submit command."""
    messages = request["messages"]
    if any(m["role"] == "assistant" for m in messages):
        return SUBMIT
    [edit] = [command for issue, command in EDITS.items() if issue in messages[1]["content"]]
    return answer(f"THOUGHT: I edit the code the issue names.\n\n```bash\n{edit}\n```")


def task_rows() -> list[dict[str, Any]]:
    rows = {r["instance_id"]: r for r in make_tasks("train")}
    return [rows[i] for i in EXPECTED]


@dataclass
class Ended:
    rollout: Rollout
    spans: list[Span]
    requests: int  # the scripted model's answers to this rollout


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Ended]]:
    """Both tasks run through the runner pool as configs/mini_swe.yaml sets the agent up."""
    from alight.command_agent import command_agent
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer
    from alight.runner import RunnerPool
    from alight.sandbox.local import check_local
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    try:
        check_local()
    except Exception as err:  # a machine without user namespaces cannot run the sandbox
        pytest.skip(f"no local sandbox here: {err}")
    cfg = to_object(load_config(CONFIG))
    agent = command_agent(cfg.agent.command, cfg.agent.name, sandbox=cfg.agent.sandbox, reward=cfg.reward)
    tasks = task_rows()
    with (
        ScriptedOpenAIServer(competent_model) as upstream,
        StoreServer(SqliteStore(tmp_path_factory.mktemp("store") / "store.db")) as store_server,
    ):
        engine = LiteLLMEngine("openai/policy", base_url=upstream.url, served_name="policy")
        proxy = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:
            with RunnerPool(agent, store_server.url, n_runners=2, instrument=False):
                rollouts, spans = asyncio.run(_run(store_server.url, proxy.url, tasks))
        finally:
            proxy.stop()
        per_task = {
            t["instance_id"]: sum(t["problem_statement"] in r.body["messages"][1]["content"] for r in upstream.requests)
            for t in tasks
        }
    yield {
        t["instance_id"]: Ended(r, s, per_task[t["instance_id"]])
        for t, r, s in zip(tasks, rollouts, spans, strict=True)
    }


async def _run(store_url: str, proxy_url: str, tasks: list[dict[str, Any]]) -> tuple[list[Rollout], list[list[Span]]]:
    from alight.store.client import StoreClient
    from alight.types import LLMResource

    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model="policy")})
        queued = await store.enqueue([Rollout(task=Task(input=t), timeout_s=240) for t in tasks])
        ids = [r.rollout_id for r in queued]
        assert len(await store.wait_for_rollouts(ids, timeout=300)) == len(ids), "rollouts did not end in time"
        return [await store.get_rollout(i) for i in ids], [await store.query_spans(i) for i in ids]


def test_the_hidden_tests_decide_the_reward(ended: dict[str, Ended]) -> None:
    for instance, expected in EXPECTED.items():
        rollout = ended[instance].rollout
        assert rollout.status == RolloutStatus.SUCCEEDED, rollout
        assert rollout.reward == pytest.approx(expected), instance
        [tests] = [s for s in ended[instance].spans if s.kind == SpanKind.REWARD]
        assert tests.attributes["tests.passed"] == PASSED[instance]


def test_every_model_call_is_recorded_and_attributed_to_mini_swe(ended: dict[str, Ended]) -> None:
    for instance, run in ended.items():
        calls = [s for s in run.spans if s.kind == SpanKind.LLM]
        assert len(calls) == run.requests == 2, instance  # the edit, then the submit
        assert {s.attributes.get(semconv.AGENT_NAME) for s in calls} == {"mini_swe"}
        [agent] = [s for s in run.spans if s.kind == SpanKind.AGENT]
        assert agent.name == "mini_swe" and all(s.parent_id == agent.span_id for s in calls)
        first = calls[0].attributes[semconv.LLM_REQUEST_MESSAGES]
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in first[0]["content"]  # mini's own (config) prompt


# -- the driver alone, in a plain working copy (no sandbox, no proxy) ---------------------------------


def drive(workdir: Path, task: Any, base_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """recipes/mini_swe/run.py in `workdir` with the variables alight gives a command agent."""
    task_file = workdir.parent / "task.json"
    task_file.write_text(json.dumps(task))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "ALIGHT"))}
    env |= {"ALIGHT_TASK_FILE": str(task_file), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "k"}
    env["ALIGHT_MODEL"] = "policy"
    return subprocess.run(
        [sys.executable, str(RUN), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_driver_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    done = drive(tmp_path / "w", {"instance_id": "x"}, "http://127.0.0.1:9/v1")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "mini_swe: the task has no problem statement (one of problem_statement, question, task, prompt)"
    ]
    done = drive(tmp_path / "w", {"problem_statement": "p"}, "http://127.0.0.1:9/v1", "--step-limit", "0")
    assert done.returncode == 2 and "--step-limit" in done.stderr and "Traceback" not in done.stderr
    done = drive(tmp_path / "w", {"problem_statement": "p"}, "http://127.0.0.1:9/v1", "--config", "nope.yaml")
    assert done.returncode == 2 and done.stderr.strip() == "mini_swe: --config nope.yaml: no such file"
    done = subprocess.run([sys.executable, str(RUN)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 2 and "ALIGHT_TASK_FILE, OPENAI_BASE_URL, ALIGHT_MODEL unset" in done.stderr


def test_out_of_format_answers_end_the_episode_and_an_unreachable_model_fails_it(tmp_path: Path) -> None:
    """Three replies without a ```bash block: mini ends with RepeatedFormatError, the driver exits 0
    (the hidden tests score what the agent left); a model that cannot be reached (LiteLLM raises
    InternalServerError) is a crash: exit 1, and alight retries the attempt."""
    task = make_tasks("train")[0]
    shutil.copytree(task["repo"], tmp_path / "w")
    with ScriptedOpenAIServer([answer("I would rather chat.")] * 3) as server:
        done = drive(tmp_path / "w", task, server.url, "--step-limit", "5")
        assert len(server.requests) == 3
    assert done.returncode == 0 and "exit status 'RepeatedFormatError'" in done.stderr, done.stderr[-2000:]
    assert done.stdout == ""  # nothing that could read as a reward
    done = drive(tmp_path / "w", task, "http://127.0.0.1:9/v1", "--retries", "1")
    assert done.returncode == 1 and "exit status 'InternalServerError'" in done.stderr, done.stderr[-2000:]


# -- alight train on the recipe ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_alight_train_runs_two_steps_of_mini_swe_with_the_embedded_engine(tmp_path: Path) -> None:
    """The CLI, the embedded tiny model (untrained: the rewards are what the hidden tests give the
    repository as it edits it, mostly the PASS_TO_PASS share), the local sandbox and the tests reward."""
    overrides = ["trainer.batch_size=1", "trainer.group_size=2", "trainer.val_size=1"]
    check_two_steps_of_train(CONFIG, "mini_swe", tmp_path / "run", overrides, timeout_s=880)


def test_a_full_context_ends_the_episode_with_the_edits_kept(tmp_path: Path) -> None:
    """The model's context fills up after the edit (the server answers with OpenAI's wording, as
    the embedded engine does): mini stops with ContextWindowExceededError, which ends the episode
    like a submit (exit 0), and the working copy keeps the fix for the hidden tests."""
    [task] = [t for t in make_tasks("train") if t["instance_id"] == "pager__pager-7"]
    shutil.copytree(task["repo"], tmp_path / "w")

    def model(request: dict[str, Any]) -> dict[str, Any]:
        if any(m["role"] == "assistant" for m in request["messages"]):
            raise ValueError("This model's maximum context length is 1024 tokens; the prompt is 1052")
        return competent_model(request)

    with ScriptedOpenAIServer(model) as server:
        done = drive(tmp_path / "w", task, server.url, "--retries", "1")
    assert done.returncode == 0 and "exit status 'ContextWindowExceededError'" in done.stderr, done.stderr[-2000:]
    assert "-(-len(self.items) // self.per_page)" in (tmp_path / "w" / "pager" / "pages.py").read_text()
