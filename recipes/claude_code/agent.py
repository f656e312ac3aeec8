#!/usr/bin/env python3
"""Anthropic's Claude Code, unchanged, as alight's command agent: one `claude -p` per attempt.

alight starts this program in the attempt's working copy (agent.sandbox.workdir) with the task in
ALIGHT_TASK_FILE and its model route in ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY and ALIGHT_MODEL.
Claude Code runs in print mode with the issue text as the prompt (recipes/swe_harness/), every
model it would pick (main, small/fast, the aliases, sub-agents) set to ALIGHT_MODEL, a private home
and config dir, its non-essential traffic, telemetry, error reporting and auto-updater off by its
own variables, and permission to edit the working copy without prompts: the coding tools are allowed
by rule (`--allowedTools`, permission mode acceptEdits). That works as root, where
`--dangerously-skip-permissions` is refused unless IS_SANDBOX=1 says the machine is a sandbox.
It exits with Claude Code's status, but 0 when Claude Code stopped on an answer cut at max_tokens
(CUT, after its own retries): the hidden tests score the edits.

    bash recipes/claude_code/install.sh        # the pinned CLI, once
    alight train configs/claude_code.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/: the shared driver
import swe_harness

INSTALL_DIR = "~/.cache/alight/harness/claude"  # where install.sh puts it
#: What `claude -p` prints (then exits 1) when the model's answer was cut at max_tokens.
CUT = re.compile(r"API Error: Claude's response exceeded the \d+ output token maximum\..*")
TOOLS = "Bash,Read,Edit,Write,Glob,Grep"  # the coding tools; no web, no sub-agents
#: Claude Code's own switches for everything that would leave the machine besides model calls.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
}
#: Every model Claude Code may pick (main, small/fast, the aliases, sub-agents): all the policy.
MODEL_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def claude_env(environ: dict[str, str], home: str) -> dict[str, str]:
    """The environment Claude Code runs with: the attempt's route and key, ALIGHT_MODEL for every
    model it picks, a private home and config dir, and its traffic switches off."""
    env: dict[str, str] = {
        key: environ[key] for key in ("PATH", "LANG", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY") if key in environ
    }
    env.update(QUIET, HOME=home, CLAUDE_CONFIG_DIR=str(Path(home, ".claude")), NO_COLOR="1")
    env.update(dict.fromkeys(MODEL_VARIABLES, environ["ALIGHT_MODEL"]))
    return env


def claude_argv(claude: str, prompt: str, model: str, system_prompt: str | None = None) -> list[str]:
    """`claude -p`: print mode, the coding tools allowed by rule, no session kept, no MCP servers;
    `system_prompt` replaces Claude Code's own."""
    replaced = ["--system-prompt", system_prompt] if system_prompt is not None else []
    permissions = ["--tools", TOOLS, "--allowedTools", TOOLS, "--permission-mode", "acceptEdits"]
    quiet = ["--no-session-persistence", "--strict-mcp-config", "--setting-sources", "", "--output-format", "text"]
    return [claude, "-p", "--model", model, *permissions, *quiet, *replaced, prompt]


def launch(
    claude: str, prompt: str, environ: dict[str, str], home: str, options: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one attempt; `--max-output-tokens` is Claude Code's
    CLAUDE_CODE_MAX_OUTPUT_TOKENS (the max_tokens of each of its calls)."""
    system_prompt = Path(options.instructions).read_text() if options.instructions is not None else None
    env = claude_env(environ, home)
    if options.max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(options.max_output_tokens)
    return claude_argv(claude, prompt, environ["ALIGHT_MODEL"], system_prompt), env


if __name__ == "__main__":
    needs = ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ALIGHT_MODEL")
    sys.exit(swe_harness.drive("claude_code", "claude", INSTALL_DIR, needs, launch, CUT))
