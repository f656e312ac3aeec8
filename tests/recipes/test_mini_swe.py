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
