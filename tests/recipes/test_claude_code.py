"""The Claude Code recipe (recipes/claude_code): the driver's command line and environment; its bad
input; and the real Claude Code, unchanged, driven through alight's proxy by a scripted model (a test
fixture that plays a competent model, tests/recipes/harness_model.py: it answers Claude Code's tool
protocol, `Read` and `Edit` tool_use over Anthropic's Messages API, so that Claude Code edits the
repository). The CLI is installed by recipes/claude_code/install.sh; without it those tests skip."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from alight.entrypoints import resolve_entrypoint
from tests.recipes import harness_runs as runs
from tests.recipes.harness_model import task_fix
from tests.recipes.harness_runs import CLAUDE

DRIVER = CLAUDE.driver
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


def test_max_output_tokens_sets_claude_codes_own_limit_only_when_given() -> None:
    """Claude Code asks for 32,000 tokens an answer unless CLAUDE_CODE_MAX_OUTPUT_TOKENS says less:
    the driver's --max-output-tokens (configs/claude_code.yaml: 32, the CPU engine's max_tokens)."""
    launch = resolve_entrypoint(f"{DRIVER}:launch")
    for given, expected in ((None, None), (32, "32")):
        options = argparse.Namespace(instructions=None, max_output_tokens=given)
        _, env = launch("/x/claude", "fix it", {"PATH": "/bin", **ENV}, "/private", options)
        assert env.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS") == expected


def test_a_max_output_tokens_below_1_is_exit_status_2(tmp_path: Path) -> None:
    """Named whether or not the CLI is installed (here it is not: an empty --install-dir)."""
    args = ("--install-dir", str(tmp_path), "--max-output-tokens", "0")
    done = runs.run_driver(DRIVER, tmp_path, {"problem_statement": "x"}, ENV, *args)
    assert done.returncode == 2 and done.stderr == "claude_code: --max-output-tokens 0: not a positive number\n"


@pytest.mark.parametrize(
    ("task", "env", "why"),
    [
        ({"problem_statement": "x"}, {"ANTHROPIC_BASE_URL": "u"}, "ANTHROPIC_API_KEY, ALIGHT_MODEL not set"),
        (["not", "a", "row"], ENV, "bad task"),
        ({"problem_statement": 3}, ENV, "bad task"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, task: Any, env: dict[str, str], why: str) -> None:
    done = runs.run_driver(DRIVER, tmp_path, task, env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and why in done.stderr, done.stderr
    assert done.stderr.startswith("claude_code: ")


@CLAUDE.installed()
def test_claude_code_edits_the_repository_through_the_proxy_and_every_call_is_recorded(tmp_path: Path) -> None:
    """The real Claude Code on a task, its model the scripted one behind alight's proxy: it reads the
    file, edits it, the hidden tests pass, and each of its Messages calls is an LLM span."""

    def expected(workdir: Path, task: dict[str, Any]) -> list[tuple[str, Any]]:
        path, [hunk] = str(workdir.resolve() / "pager" / "pages.py"), task_fix(task)
        return [
            ("Read", {"file_path": path}),
            ("Edit", {"file_path": path, "old_string": hunk.old, "new_string": hunk.new}),
        ]

    runs.check_the_fix_through_the_proxy(CLAUDE, tmp_path, expected)


@CLAUDE.installed()
def test_instructions_replace_claude_codes_system_prompt(tmp_path: Path) -> None:
    short, messages = runs.first_call_with_short_instructions(CLAUDE, tmp_path)
    [system] = [message for message in messages if message["role"] == "system"]
    assert short in system["content"] and "Claude Code" not in system["content"]


@CLAUDE.installed()
@pytest.mark.slow
def test_through_the_pool_and_sandbox_the_hidden_tests_decide_the_reward(tmp_path: Path) -> None:
    """configs/claude_code.yaml as `alight train` builds it, Claude Code in the local sandbox (see
    check_the_hidden_tests_decide)."""
    runs.check_the_hidden_tests_decide(CLAUDE, tmp_path)


@CLAUDE.installed()
def test_an_answer_cut_at_max_tokens_ends_the_episode_and_a_missing_model_fails_it(tmp_path: Path) -> None:
    """Claude Code exits 1 on a turn cut at max_tokens; the driver ends the episode there (exit 0) so the
    hidden tests score the edits; a model the proxy does not serve still fails the attempt."""
    runs.check_a_cut_answer_ends_the_episode(CLAUDE, tmp_path)


@CLAUDE.installed()
@pytest.mark.slow
def test_alight_train_updates_the_policy_on_groups_whose_rewards_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 steps of `alight train` on the recipe's config: Claude Code in the local sandbox, the tests reward,
    the embedded tiny model coached on one attempt of each group (see check_training_updates_the_policy)."""
    runs.check_training_updates_the_policy(CLAUDE, tmp_path, monkeypatch)
