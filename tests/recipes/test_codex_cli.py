"""The Codex CLI recipe (recipes/codex_cli): the driver's config, command line and environment; its
bad input; and the real Codex CLI, unchanged, driven through alight's proxy by a scripted model (a
test fixture that plays a competent model, tests/recipes/harness_model.py: it answers Codex's tool
protocol, `exec_command` function calls over the Responses API, so that Codex reads the file and
applies a patch). The CLI is installed by recipes/codex_cli/install.sh; without it those tests skip."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.entrypoints import resolve_entrypoint
from alight.types import RolloutStatus, SpanKind
from tests.recipes.harness_model import (
    REPO,
    CodingModel,
    codex_patch,
    hidden_test_outcomes,
    load_tasks,
    run_driver,
    run_through_pool,
    task_fix,
)

working_copy = resolve_entrypoint(f"{REPO / 'recipes' / 'swe_tasks' / 'data.py'}:working_copy")
DRIVER = REPO / "recipes" / "codex_cli" / "agent.py"
CONFIG = REPO / "configs" / "codex_cli.yaml"
INSTALLED = Path("~/.cache/alight/harness/codex/node_modules/.bin/codex").expanduser()
needs_codex = pytest.mark.skipif(
    not INSTALLED.is_file(), reason=f"Codex CLI not installed at {INSTALLED}: bash recipes/codex_cli/install.sh"
)
codex_config = resolve_entrypoint(f"{DRIVER}:codex_config")
codex_argv = resolve_entrypoint(f"{DRIVER}:codex_argv")
codex_env = resolve_entrypoint(f"{DRIVER}:codex_env")
ROUTE = "http://127.0.0.1:9/rollout/ro-1/attempt/at-1/agent/codex_cli/trace/t/span/s/v1"


def test_config_points_codex_at_the_attempts_route_and_turns_off_the_rest() -> None:
    config = tomllib.loads(codex_config(ROUTE, 'po"licy'))
    assert config["model"] == 'po"licy' and config["model_provider"] == "alight"
    assert config["model_providers"]["alight"] == {
        "name": "alight",
        "base_url": ROUTE,
        "env_key": "OPENAI_API_KEY",
        "wire_api": "responses",
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }
    assert (config["approval_policy"], config["sandbox_mode"]) == ("never", "danger-full-access")
    assert config["check_for_update_on_startup"] is False and config["web_search"] == "disabled"
    assert config["analytics"] == {"enabled": False} and config["agents"] == {"enabled": False}
    assert config["features"] == {"goals": False, "apps": False, "plugins": False, "image_generation": False}


def test_instructions_replace_codexs_own_only_when_given() -> None:
    assert "model_instructions_file" not in tomllib.loads(codex_config(ROUTE, "policy"))
    config = tomllib.loads(codex_config(ROUTE, "policy", "/r/short.md"))
    assert config["model_instructions_file"] == "/r/short.md" and config["model_provider"] == "alight"


def test_command_line_and_environment_hold_the_attempts_key_and_nothing_else() -> None:
    argv = codex_argv("/x/codex", "fix it")
    assert argv[:2] == ["/x/codex", "exec"] and argv[-1] == "fix it"
    assert {"--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--ephemeral"} <= set(argv)
    environ = {"PATH": "/bin", "OPENAI_API_KEY": "k", "ALIGHT_STORE_URL": "http://s", "HOME": "/root", "X": "1"}
    env = codex_env(environ, "/private")
    assert env == {
        "PATH": "/bin",
        "OPENAI_API_KEY": "k",
        "HOME": "/private",
        "CODEX_HOME": "/private",
        "NO_COLOR": "1",
        "RUST_LOG": "error",
    }


@pytest.mark.parametrize(
    ("task", "env", "why"),
    [
        ({"problem_statement": "x"}, {}, "OPENAI_BASE_URL, OPENAI_API_KEY, ALIGHT_MODEL not set"),
        ({"instance_id": "a"}, {"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "m"}, "bad task"),
        ({"problem_statement": " "}, {"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "m"}, "bad task"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(
    tmp_path: Path, task: dict[str, Any], env: dict[str, str], why: str
) -> None:
    done = run_driver(DRIVER, tmp_path, task, env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and why in done.stderr, done.stderr
    assert done.stderr.startswith("codex_cli: ")


@needs_codex
def test_a_missing_instructions_file_is_exit_status_2(tmp_path: Path) -> None:
    env = {"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "m"}
    done = run_driver(DRIVER, tmp_path, {"problem_statement": "x"}, env, "--instructions", "no-such.md")
    assert done.returncode == 2 and done.stderr == "codex_cli: --instructions no-such.md: no such file\n"


def test_a_missing_cli_names_the_install_script(tmp_path: Path) -> None:
    env = {"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "m"}
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps({"problem_statement": "x"}))
    done = subprocess.run(
        [str(DRIVER), "--install-dir", str(tmp_path / "none")],
        env={"PATH": "/usr/bin:/bin", "ALIGHT_TASK_FILE": str(task_file), **env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "run recipes/codex_cli/install.sh" in done.stderr


@needs_codex
def test_codex_edits_the_repository_through_the_proxy_and_every_call_is_recorded(tmp_path: Path) -> None:
    """The real Codex CLI on the task, its model the scripted one behind alight's proxy: it reads
    the file, applies the patch, the hidden tests pass, and each of its Responses calls is an LLM span."""
    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore
    from tests.proxy.conftest import new_attempt, spans_of

    task = load_tasks()[1]  # pager__pager-7
    hunks = task_fix(task)
    workdir = working_copy(task, tmp_path / "repo")
    model = CodingModel("codex", [task])
    with ProxyServer(Proxy(model, MemoryStore())) as server:
        rollout_id, attempt_id = new_attempt(server)
        env = {
            "OPENAI_BASE_URL": server.base_url(rollout_id, attempt_id),
            "OPENAI_API_KEY": "k",
            "ALIGHT_MODEL": "policy",
        }
        done = run_driver(DRIVER, workdir, task, env)
        spans = spans_of(server, rollout_id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""  # Codex's own output went to stderr: nothing the model writes is a reward
    assert model.tool_calls == [
        ("exec_command", {"cmd": "cat pager/pages.py"}),
        ("exec_command", {"cmd": codex_patch(hunks)}),
    ]
    outcomes = hidden_test_outcomes(task, workdir)
    assert outcomes == dict.fromkeys(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"], True)
    llm = [span for span in spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls == 3
    assert {span.attributes[semconv.LLM_API] for span in llm} == {"responses"}
    assert all(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for span in llm)
    # Codex sent back what `cat` printed: the scripted model's second call saw the file's text
    assert any("len(self.items) // self.per_page" in json.dumps(message) for message in model.requests[1].messages)


@needs_codex
@pytest.mark.slow
def test_through_the_pool_and_sandbox_the_hidden_tests_decide_the_reward(tmp_path: Path) -> None:
    """configs/codex_cli.yaml as `alight train` builds it: the real runner pool runs Codex in the
    local sandbox on two tasks of the shared set; the scripted model knows the fix of the first only.
    The hidden tests give 1.0 to the first and the share of its tests that still pass to the second;
    every call Codex made is an LLM span of the agent codex_cli, inside its AGENT span."""
    tasks = [load_tasks()[1], load_tasks()[4]]  # pager__pager-7 (fixed), statkit__statkit-3 (left alone)
    model = CodingModel("codex", tasks[:1])
    run = run_through_pool(CONFIG, model, tasks, tmp_path)
    assert [rollout.status for rollout in run.rollouts] == [RolloutStatus.SUCCEEDED] * 2, run.rollouts
    left = tasks[1]
    share = len(left["PASS_TO_PASS"]) / (len(left["FAIL_TO_PASS"]) + len(left["PASS_TO_PASS"]))
    assert [rollout.reward for rollout in run.rollouts] == [1.0, pytest.approx(share)]
    llm = [span for spans in run.spans for span in spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls and model.calls >= 4  # 3 for the fix, at least 1 for the other
    assert {span.attributes[semconv.AGENT_NAME] for span in llm} == {"codex_cli"}
    assert {span.attributes[semconv.LLM_API] for span in llm} == {"responses"}
    for spans in run.spans:
        [agent] = [span for span in spans if span.kind == SpanKind.AGENT]
        assert agent.attributes[semconv.AGENT_NAME] == "codex_cli"
        assert all(span.parent_id == agent.span_id for span in spans if span.kind == SpanKind.LLM)
