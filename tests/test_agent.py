"""The agent API: `@alight.rollout`, `LitAgent`, `load_agent`, `bind_resources`."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import alight.agent
from alight.agent import LLM, FunctionAgent, LitAgent, bind_resources, load_agent
from alight.errors import ConfigError
from alight.types import Attempt, LLMResource, PromptTemplate, ResourceSet, Rollout, Task

ROLLOUT = Rollout(rollout_id="ro-1", task=Task(input={"q": "2+2"}))
ATTEMPT = Attempt(attempt_id="at-1", rollout_id="ro-1", number=1, claimed_at=0.0, last_heartbeat_at=0.0)
LLM_A = LLM(model="policy", base_url="http://127.0.0.1:1/rollout/ro-1/attempt/at-1/v1")
RESOURCES: dict[str, Any] = {"prompt": PromptTemplate(template="{q}"), "llm": LLM_A}


@alight.agent.rollout
def sync_agent(task: dict[str, Any], llm: LLM) -> float:
    assert threading.current_thread() is not threading.main_thread()  # sync agents run in a worker thread
    return 1.0 if task["q"] == "2+2" and llm is LLM_A else 0.0


@alight.agent.rollout(name="writer")
async def async_agent(rollout: Rollout, resources: dict[str, Any], attempt: Attempt) -> None:
    assert rollout is ROLLOUT and attempt is ATTEMPT and set(resources) == {"prompt", "llm"}


class ClassAgent(LitAgent):
    def __init__(self, bonus: float = 0.5) -> None:
        super().__init__()
        self.bonus = bonus

    async def rollout(self, task: Any, optional: int = 3) -> float:  # type: ignore[override]
        await asyncio.sleep(0)
        return task["q"].count("2") + self.bonus


class NamedAgent(LitAgent):
    name = "named"

    def rollout(self) -> int:  # type: ignore[override]
        return 2


@pytest.mark.anyio
async def test_function_and_class_agents_get_what_they_declare() -> None:
    assert isinstance(sync_agent, FunctionAgent) and sync_agent.name == "sync_agent"
    assert await sync_agent.run(ROLLOUT.task.input, RESOURCES, ROLLOUT, ATTEMPT) == 1.0
    assert async_agent.name == "writer"
    assert await async_agent.run(ROLLOUT.task.input, RESOURCES, ROLLOUT, ATTEMPT) is None
    agent = ClassAgent()
    assert agent.name == "ClassAgent"
    assert await agent.run(ROLLOUT.task.input, RESOURCES, ROLLOUT) == 2.5
    named = NamedAgent()
    assert named.name == "named" and await named.run(None, {}, ROLLOUT) == 2.0
    assert NamedAgent(name="renamed").name == "renamed"


def test_decorated_functions_stay_callable() -> None:
    assert sync_agent.fn is sync_agent.__wrapped__
    assert FunctionAgent(lambda task: task * 2)(21) == 42  # calling it needs no alight machinery


@pytest.mark.anyio
async def test_llm_is_the_first_llm_resource_when_none_is_named_llm() -> None:
    @alight.agent.rollout
    def agent(llm: LLM | None) -> float:
        return 1.0 if llm is LLM_A else 0.0

    assert await agent.run(None, {"prompt": RESOURCES["prompt"], "policy": LLM_A}, ROLLOUT) == 1.0
    assert await agent.run(None, {}, ROLLOUT) == 0.0


@pytest.mark.anyio
async def test_a_non_float_return_is_an_error() -> None:
    @alight.agent.rollout
    def agent() -> str:
        return "great"

    with pytest.raises(TypeError, match="agent agent returned str"):
        await agent.run(None, {}, ROLLOUT)


def test_unknown_required_parameter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"agent bad: parameter 'question' is not one alight can pass"):

        @alight.agent.rollout
        def bad(task: Any, question: str) -> None: ...


def test_bind_resources_binds_llms_to_the_attempt() -> None:
    resource_set = ResourceSet(
        version=3,
        resources={
            "llm": LLMResource(endpoint="http://proxy:8123/", model="m", sampling_parameters={"temperature": 0.7}),
            "prompt": PromptTemplate(template="hi"),
        },
        created_at=0.0,
    )
    bound = bind_resources(resource_set, "ro-1", "at-2")
    assert bound["llm"] == LLM(
        model="m",
        base_url="http://proxy:8123/rollout/ro-1/attempt/at-2/v1",
        api_key="alight",
        sampling_parameters={"temperature": 0.7},
    )
    assert bound["prompt"] == PromptTemplate(template="hi")
    assert bind_resources(None, "ro-1", "at-2") == {}


def test_load_agent_from_a_module_and_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_agent("tests.test_agent:sync_agent") is sync_agent
    assert isinstance(load_agent("tests.test_agent:ClassAgent"), ClassAgent)
    source = textwrap.dedent(
        """
        import helper_mod  # the agent's own folder is importable

        def solve(task):
            return helper_mod.VALUE

        class Holder:
            def agent(task):
                return 1.0
        """
    )
    (tmp_path / "my_agent.py").write_text(source)
    (tmp_path / "helper_mod.py").write_text("VALUE = 0.25\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    agent = load_agent(f"{tmp_path}/my_agent.py:solve")
    assert isinstance(agent, FunctionAgent) and agent.name == "solve"
    assert asyncio.run(agent.run(None, {}, ROLLOUT)) == 0.25
    assert load_agent(f"{tmp_path}/my_agent.py:Holder.agent").name == "agent"


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("no_colon", "must look like 'module:function'"),
        ("tests.test_agent:", "must look like"),
        ("no.such.module:agent", "no module named 'no'"),
        ("tests.test_agent:missing", "has no attribute 'missing'"),
        ("tests.test_agent:ROLLOUT", "is a Rollout, not a function or LitAgent"),
        ("/nowhere/agent.py:solve", "no such file /nowhere/agent.py"),
        ("{broken}:solve", "no module named '{broken}'"),
    ],
)
def test_bad_entrypoints_are_one_line_config_errors(entrypoint: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent(entrypoint)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_file_that_fails_to_import_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    (tmp_path / "needs_args.py").write_text(
        "from alight.agent import LitAgent\n"
        "class A(LitAgent):\n    def __init__(self, x):\n        super().__init__()\n"
    )
    with pytest.raises(ConfigError, match=r"importing .*broken.py failed: RuntimeError: boom second line$"):
        load_agent(f"{tmp_path}/broken.py:solve")
    with pytest.raises(ConfigError, match=r"cannot create A\(\)"):
        load_agent(f"{tmp_path}/needs_args.py:A")
