"""The Claude Code recipe (recipes/claude_code): the driver's command line and environment; its bad
input; and the real Claude Code, unchanged, driven through alight's proxy by a scripted model (a test
fixture that plays a competent model, tests/recipes/harness_model.py: it answers Claude Code's tool
protocol, `Read` and `Edit` tool_use over Anthropic's Messages API, so that Claude Code edits the
repository). The CLI is installed by recipes/claude_code/install.sh; without it those tests skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alight import semconv
from alight.entrypoints import resolve_entrypoint
from alight.types import RolloutStatus, SpanKind
from tests.recipes.harness_model import (
    REPO,
    CodingModel,
    hidden_test_outcomes,
    load_tasks,
    run_driver,
    run_through_pool,
    task_fix,
)

working_copy = resolve_entrypoint(f"{REPO / 'recipes' / 'swe_tasks' / 'data.py'}:working_copy")
DRIVER = REPO / "recipes" / "claude_code" / "agent.py"
CONFIG = REPO / "configs" / "claude_code.yaml"
INSTALLED = Path("~/.cache/alight/harness/claude/node_modules/.bin/claude").expanduser()
needs_claude = pytest.mark.skipif(
    not INSTALLED.is_file(), reason=f"Claude Code not installed at {INSTALLED}: bash recipes/claude_code/install.sh"
)
claude_argv = resolve_entrypoint(f"{DRIVER}:claude_argv")
claude_env = resolve_entrypoint(f"{DRIVER}:claude_env")
ENV = {"ANTHROPIC_BASE_URL": "u", "ANTHROPIC_API_KEY": "k", "ALIGHT_MODEL": "m"}


def test_command_line_allows_the_coding_tools_without_prompts_or_bypass() -> None:
    argv = claude_argv("/x/claude", "fix it", "policy")
    assert argv[:2] == ["/x/claude", "-p"] and argv[-1] == "fix it"
    options = dict(zip(argv[2:-1:2], argv[3:-1:2], strict=False))
    assert options["--model"] == "policy" and options["--permission-mode"] == "acceptEdits"
    assert options["--tools"] == options["--allowedTools"] == "Bash,Read,Edit,Write,Glob,Grep"
    assert "--dangerously-skip-permissions" not in argv  # refused as root
    assert {"--no-session-persistence", "--strict-mcp-config"} <= set(argv)


def test_a_system_prompt_replaces_claude_codes_own_only_when_given() -> None:
    assert "--system-prompt" not in claude_argv("/x/claude", "fix it", "policy")
    argv = claude_argv("/x/claude", "fix it", "policy", "Be brief.")
    assert argv[argv.index("--system-prompt") + 1] == "Be brief." and argv[-1] == "fix it"


def test_environment_sets_every_model_and_turns_its_traffic_off() -> None:
    environ = {"PATH": "/bin", **ENV, "ALIGHT_STORE_URL": "http://s", "HOME": "/root", "OPENAI_API_KEY": "k"}
    env = claude_env(environ, "/private")
    models = [key for key, value in env.items() if value == "m"]
    assert sorted(models) == sorted(
        ["ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
         "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"]
    )  # fmt: skip
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"], env["PATH"]) == ("u", "k", "/bin")
    assert env["HOME"] == "/private" and env["CLAUDE_CONFIG_DIR"] == "/private/.claude"
    for switch in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_AUTOUPDATER",
        "DISABLE_ERROR_REPORTING",
    ):
        assert env[switch] == "1"
    assert "ALIGHT_STORE_URL" not in env and "OPENAI_API_KEY" not in env


@pytest.mark.parametrize(
    ("task", "env", "why"),
    [
        ({"problem_statement": "x"}, {"ANTHROPIC_BASE_URL": "u"}, "ANTHROPIC_API_KEY, ALIGHT_MODEL not set"),
        (["not", "a", "row"], ENV, "bad task"),
        ({"problem_statement": 3}, ENV, "bad task"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, task: Any, env: dict[str, str], why: str) -> None:
    done = run_driver(DRIVER, tmp_path, task, env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and why in done.stderr, done.stderr
    assert done.stderr.startswith("claude_code: ")


@needs_claude
def test_claude_code_edits_the_repository_through_the_proxy_and_every_call_is_recorded(tmp_path: Path) -> None:
    """The real Claude Code on the task, its model the scripted one behind alight's proxy: it reads
    the file, edits it, the hidden tests pass, and each of its Messages calls is an LLM span."""
    from alight.proxy import Proxy, ProxyServer
    from alight.store import MemoryStore
    from tests.proxy.conftest import new_attempt, spans_of

    task = load_tasks()[1]  # pager__pager-7
    hunks = task_fix(task)
    workdir = working_copy(task, tmp_path / "repo")
    model = CodingModel("claude", [task])
    with ProxyServer(Proxy(model, MemoryStore())) as server:
        rollout_id, attempt_id = new_attempt(server)
        route = server.base_url(rollout_id, attempt_id).removesuffix("/v1")
        done = run_driver(
            DRIVER, workdir, task, {"ANTHROPIC_BASE_URL": route, "ANTHROPIC_API_KEY": "k", "ALIGHT_MODEL": "policy"}
        )
        spans = spans_of(server, rollout_id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""  # Claude Code's own output went to stderr: nothing the model writes is a reward
    path = str(workdir.resolve() / "pager" / "pages.py")
    assert model.tool_calls == [
        ("Read", {"file_path": path}),
        ("Edit", {"file_path": path, "old_string": hunks[0].old, "new_string": hunks[0].new}),
    ]
    outcomes = hidden_test_outcomes(task, workdir)
    assert outcomes == dict.fromkeys(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"], True)
    llm = [span for span in spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls == 3
    assert {span.attributes[semconv.LLM_API] for span in llm} == {"anthropic"}
    assert all(span.attributes[semconv.LLM_RESPONSE_TOKEN_IDS] for span in llm)
    # Claude Code sent back what Read gave: the scripted model's second call saw the file's text
    assert any("len(self.items) // self.per_page" in json.dumps(message) for message in model.requests[1].messages)


@needs_claude
@pytest.mark.slow
def test_through_the_pool_and_sandbox_the_hidden_tests_decide_the_reward(tmp_path: Path) -> None:
    """configs/claude_code.yaml as `alight train` builds it: the real runner pool runs Claude Code in
    the local sandbox on two tasks of the shared set; the scripted model knows the fix of the first
    only. The hidden tests give 1.0 to the first and the share of its tests that still pass to the
    second; every call Claude Code made is an LLM span of the agent claude_code, inside its AGENT span."""
    tasks = [load_tasks()[1], load_tasks()[4]]  # pager__pager-7 (fixed), statkit__statkit-3 (left alone)
    model = CodingModel("claude", tasks[:1])
    run = run_through_pool(CONFIG, model, tasks, tmp_path)
    assert [rollout.status for rollout in run.rollouts] == [RolloutStatus.SUCCEEDED] * 2, run.rollouts
    left = tasks[1]
    share = len(left["PASS_TO_PASS"]) / (len(left["FAIL_TO_PASS"]) + len(left["PASS_TO_PASS"]))
    assert [rollout.reward for rollout in run.rollouts] == [1.0, pytest.approx(share)]
    llm = [span for spans in run.spans for span in spans if span.kind == SpanKind.LLM]
    assert len(llm) == model.calls and model.calls >= 4  # 3 for the fix, at least 1 for the other
    assert {span.attributes[semconv.AGENT_NAME] for span in llm} == {"claude_code"}
    assert {span.attributes[semconv.LLM_API] for span in llm} == {"anthropic"}
    for spans in run.spans:
        [agent] = [span for span in spans if span.kind == SpanKind.AGENT]
        assert agent.attributes[semconv.AGENT_NAME] == "claude_code"
        assert all(span.parent_id == agent.span_id for span in spans if span.kind == SpanKind.LLM)
