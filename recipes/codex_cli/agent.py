#!/usr/bin/env python3
"""OpenAI's Codex CLI, unchanged, as alight's command agent: one `codex exec` per attempt.

alight starts this program in the attempt's working copy (agent.sandbox.workdir) with the task in
ALIGHT_TASK_FILE and its model route in OPENAI_BASE_URL, OPENAI_API_KEY and ALIGHT_MODEL. It writes
a private CODEX_HOME whose config.toml names one model provider, `alight` (base_url = the route,
env_key = OPENAI_API_KEY, wire_api = responses), turns off what would reach elsewhere or offer the
model tools the proxy does not take (update checks, analytics, web search, apps, plugins, goals,
sub-agents), and runs `codex exec` full-auto with Codex's own sandbox off (alight's sandbox isolates
the attempt), the task's issue text as the prompt (recipes/swe_harness/). Exits with Codex's status,
but 0 when Codex stopped on an answer cut at max_tokens (CUT): the hidden tests score the edits.

    bash recipes/codex_cli/install.sh          # the pinned CLI, once
    alight train configs/codex_cli.yaml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/: the shared driver
import swe_harness

INSTALL_DIR = "~/.cache/alight/harness/codex"  # where install.sh puts it
PROVIDER = "alight"
#: What `codex exec` prints (then exits 1) when the model's answer was cut at max_tokens.
CUT = re.compile(r"ERROR: Incomplete response returned, reason: max_output_tokens")


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def codex_config(base_url: str, model: str, instructions: str | None = None) -> str:
    """config.toml for one attempt: the alight provider, full auto, nothing that reaches elsewhere;
    `instructions`: a file whose text replaces Codex's own base instructions."""
    replaced = f"model_instructions_file = {_toml(instructions)}\n" if instructions else ""
    return (
        replaced
        + f"""model = {_toml(model)}
model_provider = "{PROVIDER}"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.{PROVIDER}]
name = "{PROVIDER}"
base_url = {_toml(base_url)}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[history]
persistence = "none"

[agents]
enabled = false

[features]
goals = false
apps = false
plugins = false
image_generation = false
"""
    )


def codex_argv(codex: str, prompt: str) -> list[str]:
    """`codex exec`: non-interactive, no approvals, Codex's own sandbox off, any directory."""
    flags = ["--skip-git-repo-check", "--ephemeral", "--dangerously-bypass-approvals-and-sandbox", "--color", "never"]
    return [codex, "exec", *flags, prompt]


def codex_env(environ: dict[str, str], home: str) -> dict[str, str]:
    """The environment Codex runs with: the attempt's key, a private home, the PATH it was given."""
    env: dict[str, str] = {key: environ[key] for key in ("PATH", "LANG", "OPENAI_API_KEY") if key in environ}
    env.update(HOME=home, CODEX_HOME=home, NO_COLOR="1", RUST_LOG="error")
    return env


def launch(
    codex: str, prompt: str, environ: dict[str, str], home: str, options: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """Write the attempt's config.toml into the private home; the command line and environment."""
    config = codex_config(environ["OPENAI_BASE_URL"], environ["ALIGHT_MODEL"], options.instructions)
    Path(home, "config.toml").write_text(config)
    return codex_argv(codex, prompt), codex_env(environ, home)


if __name__ == "__main__":
    sys.exit(
        swe_harness.drive(
            "codex_cli", "codex", INSTALL_DIR, ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ALIGHT_MODEL"), launch, CUT
        )
    )
