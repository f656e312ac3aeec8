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

from alight.entrypoints import resolve_entrypoint
from tests.recipes.harness_model import codex_patch, task_fix
from tests.recipes.harness_runs import (
    CODEX,
    check_a_cut_answer_ends_the_episode,
    check_the_fix_through_the_proxy,
    check_the_hidden_tests_decide,
    check_training_updates_the_policy,
    first_call_with_short_instructions,
    run_driver,
)

DRIVER = CODEX.driver
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


def test_a_missing_instructions_file_is_exit_status_2(tmp_path: Path) -> None:
    """Named whether or not the CLI is installed (here it is not: an empty --install-dir)."""
    env = {"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "ALIGHT_MODEL": "m"}
    args = ("--install-dir", str(tmp_path), "--instructions", "no-such.md")
    done = run_driver(DRIVER, tmp_path, {"problem_statement": "x"}, env, *args)
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


@CODEX.installed()
def test_codex_edits_the_repository_through_the_proxy_and_every_call_is_recorded(tmp_path: Path) -> None:
    """The real Codex CLI on a task, its model the scripted one behind alight's proxy: it reads the
    file, applies the patch, the hidden tests pass, and each of its Responses calls is an LLM span."""

    def expected(workdir: Path, task: dict[str, Any]) -> list[tuple[str, Any]]:
        return [("exec_command", {"cmd": "cat pager/pages.py"}), ("exec_command", {"cmd": codex_patch(task_fix(task))})]

    check_the_fix_through_the_proxy(CODEX, tmp_path, expected)


@CODEX.installed()
def test_instructions_replace_codexs_system_prompt(tmp_path: Path) -> None:
    short, messages = first_call_with_short_instructions(CODEX, tmp_path)
    assert messages[0] == {"role": "system", "content": short}


@CODEX.installed()
@pytest.mark.slow
def test_through_the_pool_and_sandbox_the_hidden_tests_decide_the_reward(tmp_path: Path) -> None:
    """configs/codex_cli.yaml as `alight train` builds it, Codex in the local sandbox (see
    check_the_hidden_tests_decide)."""
    check_the_hidden_tests_decide(CODEX, tmp_path)


@CODEX.installed()
def test_an_answer_cut_at_max_tokens_ends_the_episode_and_a_missing_model_fails_it(tmp_path: Path) -> None:
    """Codex exits 1 on a turn cut at max_tokens; the driver ends the episode there (exit 0) so the
    hidden tests score the edits; a model the proxy does not serve still fails the attempt."""
    check_a_cut_answer_ends_the_episode(CODEX, tmp_path)


@CODEX.installed()
@pytest.mark.slow
def test_alight_train_updates_the_policy_on_groups_whose_rewards_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 steps of `alight train` on the recipe's config: Codex in the local sandbox, the tests reward,
    the embedded tiny model coached on one attempt of each group (see check_training_updates_the_policy)."""
    check_training_updates_the_policy(CODEX, tmp_path, monkeypatch)
