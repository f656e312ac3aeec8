"""Running a harness recipe (codex_cli, claude_code) for its tests: its driver on one task behind a
proxy, and its config through the real runner pool, sandbox and tests reward, with the scripted coding
model of tests/recipes/harness_model.py; and what both recipes' tests check of such runs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from alight import semconv
from alight.entrypoints import resolve_entrypoint
from alight.types import RolloutStatus, Span, SpanKind
from tests.recipes.harness_model import CodingModel, CutModel, coached_engine
from tests.recipes.train_runs import check_the_run

REPO = Path(__file__).resolve().parents[2]
TASKS_FILE = REPO / "recipes" / "swe_tasks" / "tasks.jsonl"
MODEL = {"ALIGHT_MODEL": "policy"}  # the served name the proxy answers to
working_copy = resolve_entrypoint(f"{REPO / 'recipes' / 'swe_tasks' / 'data.py'}:working_copy")


@dataclass(frozen=True)
class Harness:
    """One harness recipe, as its tests see it."""

    name: str  # the recipe and agent name: codex_cli, claude_code
    program: str  # the CLI under the install prefix's node_modules/.bin
    plays: str  # what CodingModel plays: codex, claude
    api: str  # the API its calls reach the proxy by (the LLM spans' llm.api)

    @property
    def driver(self) -> Path:
        return REPO / "recipes" / self.name / "agent.py"

    @property
    def config(self) -> Path:
        return REPO / "configs" / f"{self.name}.yaml"

    def installed(self) -> pytest.MarkDecorator:
        """Skip unless the recipe's install.sh has put the CLI in its default prefix."""
        cli = Path(f"~/.cache/alight/harness/{self.program}/node_modules/.bin/{self.program}").expanduser()
        return pytest.mark.skipif(not cli.is_file(), reason=f"{cli} missing: bash recipes/{self.name}/install.sh")

    def route_env(self, base_url: str) -> dict[str, str]:
        """What alight's command agent sets for the harness's model calls: the route, a key, the model."""
        if self.api == "anthropic":
            return {
                "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
                "ANTHROPIC_API_KEY": "k",
                "ALIGHT_MODEL": "policy",
            }
        return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "policy"}


CODEX = Harness("codex_cli", "codex", "codex", "responses")
CLAUDE = Harness("claude_code", "claude", "claude", "anthropic")


# -- the shared task set, and running a recipe's driver on a task --------------------------------


def load_tasks(split: str | None = None) -> list[dict[str, Any]]:
    """The shared set's rows (recipes/swe_tasks), `repo` and `tests` absolute."""
    rows = [json.loads(line) for line in TASKS_FILE.read_text().splitlines() if line.strip()]
    for row in rows:
        row["repo"], row["tests"] = str(REPO / row["repo"]), str(REPO / row["tests"])
    return [row for row in rows if split is None or row["split"] == split]


def hidden_test_outcomes(task: dict[str, Any], workdir: Path) -> dict[str, bool]:
    """Copy the task's hidden tests into `workdir` under their folder's name (as the tests reward
    does) and run them: node id -> passed."""
    shutil.copytree(task["tests"], workdir / Path(task["tests"]).name, dirs_exist_ok=True)
    report = workdir.parent / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=workdir, capture_output=True, timeout=120,
    )  # fmt: skip
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcomes[node] = not any(child.tag in ("failure", "error", "skipped") for child in case)
    return outcomes


def run_driver(
    driver: Path, workdir: Path, task: Any, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run a recipe's driver as alight's command agent does: in the working copy, the task in
    ALIGHT_TASK_FILE, `env` (the attempt's route, key and model) and nothing else but PATH."""
    task_file = workdir.parent / "task.json"
    task_file.write_text(json.dumps(task))
    full = {"PATH": os.environ["PATH"], "ALIGHT_TASK_FILE": str(task_file), **env}
    return subprocess.run([str(driver), *args], cwd=workdir, env=full, capture_output=True, text=True, timeout=180)


# -- a recipe's config through the real runner pool, sandbox and tests reward ---------------------


@dataclass
class PoolRun:
    rollouts: list[Any]  # alight.types.Rollout, in the order of the tasks
    spans: list[list[Any]]  # each rollout's spans


def run_through_pool(config: Path, model: CodingModel, tasks: list[dict[str, Any]], where: Path) -> PoolRun:
    """The recipe's config as `alight train` builds its agent (the command agent in its sandbox, the
    tests reward), run by the real runner pool on `tasks` against a store server (SQLite) and the
    proxy in front of `model`, published as the `llm` resource."""
    from alight.agent_setup import runner_agent
    from alight.config.loading import load_config, to_object
    from alight.errors import ConfigError
    from alight.proxy import Proxy, ProxyServer
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore
    from alight.types import LLMResource, Rollout, Task

    cfg = to_object(load_config(config))
    try:
        agent = runner_agent(cfg.agent, reward=cfg.reward)  # checks the sandbox as `alight train` does
    except ConfigError as err:
        pytest.skip(f"this machine cannot run the recipe's sandbox: {err}")

    async def run(store_url: str, proxy_url: str) -> list[str]:
        async with StoreClient(store_url) as store:
            await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model="policy")})
            enqueued = await store.enqueue([Rollout(task=Task(input=task), timeout_s=300) for task in tasks])
            ids = [rollout.rollout_id for rollout in enqueued]
            with RunnerPool(agent, store_url, n_runners=2):
                ended = await store.wait_for_rollouts(ids, timeout=400)
            assert len(ended) == len(ids), "rollouts did not end in time"
            return ids

    async def read(store_url: str, ids: list[str]) -> PoolRun:
        async with StoreClient(store_url) as store:
            return PoolRun([await store.get_rollout(i) for i in ids], [await store.query_spans(i) for i in ids])

    with (
        StoreServer(SqliteStore(where / "store.db")) as store_server,
        ProxyServer(Proxy(model, StoreClient(store_server.url))) as proxy_server,
    ):
        ids = asyncio.run(run(store_server.url, proxy_server.url))
        proxy_server.flush()  # every answered call's span is in the store
        return asyncio.run(read(store_server.url, ids))


@dataclass
class ProxyDrive:
    done: subprocess.CompletedProcess[str]  # the driver's run
    spans: list[Span]  # what the proxy recorded
    workdir: Path  # the working copy the harness edited


def drive_through_proxy(
    harness: Harness, model: CodingModel, task: dict[str, Any], where: Path, *args: str
) -> ProxyDrive:
    """The recipe's driver on `task` in a fresh working copy, its model `model` behind a real proxy
    (MemoryStore): as the command agent runs it, without the sandbox."""
    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore
    from tests.proxy.conftest import new_attempt, spans_of

    workdir = working_copy(task, where / "repo")
    with ProxyServer(Proxy(model, MemoryStore())) as server:
        rollout_id, attempt_id = new_attempt(server)
        done = run_driver(
            harness.driver, workdir, task, harness.route_env(server.base_url(rollout_id, attempt_id)), *args
        )
        return ProxyDrive(done, spans_of(server, rollout_id), workdir)


def first_call_with_short_instructions(harness: Harness, where: Path) -> tuple[str, list[dict[str, Any]]]:
    """The driver with `--instructions recipes/swe_harness/small_model_instructions.md` behind a proxy: (the
    file's text, the messages of the harness's first model call)."""
    short = REPO / "recipes" / "swe_harness" / "small_model_instructions.md"
    model = CodingModel(harness.plays, [])
    run = drive_through_proxy(harness, model, load_tasks()[1], where, "--instructions", str(short))
    assert run.done.returncode == 0, run.done.stderr[-2000:]
    return short.read_text().strip(), model.requests[0].messages


def check_the_fix_through_the_proxy(
    harness: Harness, where: Path, expected_calls: Callable[[Path, dict[str, Any]], list[tuple[str, Any]]]
) -> None:
    """The real CLI on pager__pager-7, its model the scripted one behind a proxy: the tool calls are
    `expected_calls(working copy, task)`, the hidden tests pass after them, nothing reached the
    driver's stdout (the CLI's own output goes to stderr, so nothing the model writes is a reward),
    each of the CLI's calls is an LLM span with token ids, and the CLI sent the file's text back."""
    task = load_tasks()[1]  # pager__pager-7
    model = CodingModel(harness.plays, [task])
    run = drive_through_proxy(harness, model, task, where)
    assert run.done.returncode == 0, run.done.stderr[-2000:]
    assert run.done.stdout == ""
    assert model.tool_calls == expected_calls(run.workdir, task)
    assert hidden_test_outcomes(task, run.workdir) == dict.fromkeys(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"], True)
    llm = [span for span in run.spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls == 3
    assert {span.attributes[semconv.LLM_API] for span in llm} == {harness.api}
    assert all(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for span in llm)
    assert "len(self.items) // self.per_page" in json.dumps(model.requests[1].messages)


def check_the_hidden_tests_decide(harness: Harness, where: Path) -> None:
    """The recipe's config through the pool and sandbox on two tasks of the shared set, the scripted
    model knowing the fix of the first only: the hidden tests give 1.0 to the first and the share of
    its tests that still pass to the second; every call the harness made is an LLM span of the
    harness's agent, inside its AGENT span."""
    tasks = [load_tasks()[1], load_tasks()[4]]  # pager__pager-7 (fixed), statkit__statkit-3 (left alone)
    model = CodingModel(harness.plays, tasks[:1])
    run = run_through_pool(harness.config, model, tasks, where)
    assert [rollout.status for rollout in run.rollouts] == [RolloutStatus.SUCCEEDED] * 2, run.rollouts
    left = tasks[1]
    share = len(left["PASS_TO_PASS"]) / (len(left["FAIL_TO_PASS"]) + len(left["PASS_TO_PASS"]))
    assert [rollout.reward for rollout in run.rollouts] == [1.0, pytest.approx(share)]
    llm = [span for spans in run.spans for span in spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls and model.calls >= 4  # 3 for the fix, at least 1 for the other
    assert {span.attributes[semconv.AGENT_NAME] for span in llm} == {harness.name}
    assert {span.attributes[semconv.LLM_API] for span in llm} == {harness.api}
    for spans in run.spans:
        [agent] = [span for span in spans if span.kind == SpanKind.AGENT]
        assert agent.attributes[semconv.AGENT_NAME] == harness.name
        assert all(span.parent_id == agent.span_id for span in spans if span.kind == SpanKind.LLM)


def check_a_cut_answer_ends_the_episode(harness: Harness, where: Path) -> None:
    """The real CLI on pager__pager-7, the scripted model making the fix and then cutting its summing
    up at max_tokens (finish_reason "length"): the CLI fails that turn, but the driver ends the
    episode (exit 0) and the hidden tests score the working copy: all pass. A route the proxy does
    not serve (404: the model is not there) still fails the attempt, exit status non-zero."""
    task = load_tasks()[1]
    run = drive_through_proxy(harness, CutModel(harness.plays, [task]), task, where / "cut")
    assert run.done.returncode == 0, run.done.stderr[-2000:]
    ended = f"{harness.name}: the model's answer was cut at max_tokens: the episode ends here\n"
    assert run.done.stderr.endswith(ended)
    assert run.done.stdout == ""
    assert hidden_test_outcomes(task, run.workdir) == dict.fromkeys(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"], True)
    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore

    workdir = working_copy(task, where / "nowhere" / "repo")
    with ProxyServer(Proxy(CodingModel(harness.plays, [task]), MemoryStore())) as server:
        done = run_driver(harness.driver, workdir, task, harness.route_env(f"{server.url}/nowhere/v1"))
    assert done.returncode != 0 and "episode ends here" not in done.stderr, done.stderr[-2000:]


def check_training_updates_the_policy(harness: Harness, where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`alight train` on the recipe's config in this process (`Trainer.fit`, as the CLI runs it), 2
    steps of 1 task x 2 attempts, the real CLI in the local sandbox and the tests reward, on a policy
    that learns: the embedded tiny model (its context stretched to the harnesses' ~25k-byte prompts;
    trained on each prompt's last 256 tokens), coached (`coached_engine`): in each step's group one
    attempt fixes the task (reward 1) and one leaves it (reward below 1), so the update takes an
    optimizer step, the weights move and the next step's calls record the version the update
    published (coached answers do not depend on the served weights: calc's tests show them loaded). (The engine's
    own generation on the harnesses' prompts, cut at max_tokens, is `check_a_cut_answer_ends_the_episode`'s
    and tests/integration's.)"""
    from safetensors.torch import load_file

    from alight.config.loading import load_config, to_object
    from alight.engines import factory
    from alight.models.tiny import build_tiny_model
    from alight.store.sqlite import SqliteStore
    from alight.trainer import Trainer
    from alight.types import RolloutMode

    policy = build_tiny_model(where / "policy", max_position_embeddings=32768)
    engine = coached_engine(CodingModel(harness.plays, load_tasks()))
    factory.ENGINES.register("coached", engine)  # an engine kind of the test's own, chosen by name
    monkeypatch.chdir(REPO)
    overrides = [
        "engine.kind=coached", f"engine.model={policy}", "engine.sampling.max_tokens=8",
        "adapter.max_prompt_length=256",
        "trainer.steps=2", "trainer.batch_size=1", "trainer.group_size=2", "trainer.val_size=1",
        "trainer.save_every=1", "trainer.keep_checkpoints=3", f"trainer.output_dir={where / 'runs'}",
        "logging.dashboard=false", "logging.plot=false",
    ]  # fmt: skip
    try:
        result = Trainer(to_object(load_config(harness.config, overrides))).fit()
    finally:
        factory.ENGINES.unregister("coached")
    check_the_run(result.run_dir, harness.name, per_step=2)

    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["actor/optimizer_steps"] >= 1 for m in metrics[1:]), metrics
    assert engine.calls >= 3 * 3 + 3 * 1  # 3 calls a fix (first val, 2 train), 1 a summary (2 train, last val)

    async def train_rollouts() -> list[tuple[Any, list[Span]]]:
        store = SqliteStore(result.run_dir / "store.db")
        try:
            rollouts = await store.list_rollouts(mode=RolloutMode.TRAIN)
            return [(r, await store.query_spans(r.rollout_id)) for r in rollouts]
        finally:
            await store.close()

    by_group: dict[str | None, list[tuple[Any, list[Span]]]] = {}
    for rollout, spans in asyncio.run(train_rollouts()):
        by_group.setdefault(rollout.group_id, []).append((rollout, spans))
    for step, group in enumerate(sorted(by_group.values(), key=lambda g: g[0][0].created_at), start=1):
        rewards = sorted(rollout.reward for rollout, _ in group)
        assert rewards[0] < rewards[1] == 1.0, (step, rewards)  # one attempt fixed the task, one did not
        versions = {
            s.attributes.get(semconv.RESOURCES_VERSION) for _, spans in group for s in spans if s.kind == SpanKind.LLM
        }
        assert versions == {step - 1}, (step, versions)  # step 2's calls carry step 1's version
    first, trained = (
        load_file(str(policy / "model.safetensors")),
        load_file(str(result.run_dir / "checkpoints" / "step_000002" / "model.safetensors")),
    )
    assert any(not first[name].equal(trained[name]) for name in first)
