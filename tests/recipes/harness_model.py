"""A scripted coding model for the harness recipes (codex_cli, claude_code): a test fixture that
plays a competent model through alight's proxy, standing in for an LLM that can code (no model that
runs here can drive a coding agent).

It speaks chat completions; the proxy turns each harness's own API (Codex: Responses, Claude Code:
Anthropic Messages) into these calls and the answers back. For the task whose issue it recognises it
does what a competent model does with that harness's tools: it reads the file the issue is about,
edits it (Codex: `apply_patch` through its `exec_command` shell tool; Claude Code: `Read`, then `Edit`
with the absolute path of the working directory named in Claude Code's system reminder), then ends
with a summary. Any other request (a side call without tools) gets a short text. Every request it
answers is counted in `calls`, so a test can compare it with the LLM spans the store holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from alight.engines.base import ChatRequest, Generation
from tests.proxy.scripted import ScriptedEngine

SUMMARY = "Fixed it: the file now does what the issue asks."


@dataclass(frozen=True)
class Fix:
    """The edit that resolves one task: in `path` (relative to the repository), `old` becomes `new`."""

    issue_phrase: str  # a phrase of the task's problem_statement that names the task
    path: str
    old: str
    new: str


def codex_patch(fix: Fix) -> str:
    """The shell command a Codex model sends to edit a file: Codex's `apply_patch` format."""
    lines = ["*** Begin Patch", f"*** Update File: {fix.path}", "@@"]
    lines += [f"-{line}" for line in fix.old.splitlines()] + [f"+{line}" for line in fix.new.splitlines()]
    return "apply_patch <<'PATCH'\n" + "\n".join([*lines, "*** End Patch"]) + "\nPATCH\n"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


class CodingModel(ScriptedEngine):
    """Plays `harness` ("codex" or "claude") through the fixes it knows; see the module docstring."""

    name = "coding-model"

    def __init__(self, harness: str, fixes: list[Fix], *, model: str = "policy") -> None:
        super().__init__(model=model, text=SUMMARY)
        self.harness, self.fixes = harness, fixes
        self.calls = 0
        self.tool_calls: list[tuple[str, dict[str, Any]]] = []  # every tool call it made, in order

    def steps(self, fix: Fix, messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls this harness's model makes for `fix`, in order."""
        if self.harness == "codex":
            return [("exec_command", {"cmd": f"cat {fix.path}"}), ("exec_command", {"cmd": codex_patch(fix)})]
        found = re.search(r"Primary working directory: (\S+)", "\n".join(_text(m) for m in messages))
        assert found, "Claude Code names its working directory in its system reminder"
        path = f"{found.group(1)}/{fix.path}"
        return [
            ("Read", {"file_path": path}),
            ("Edit", {"file_path": path, "old_string": fix.old, "new_string": fix.new}),
        ]

    async def chat(self, request: ChatRequest) -> Generation:
        self.calls += 1
        self.requests.append(request)
        messages = request.messages
        offered = {tool["function"]["name"] for tool in request.tools or []}
        conversation = "\n".join(_text(m) for m in messages if m["role"] == "user")
        fix = next((f for f in self.fixes if f.issue_phrase in conversation), None)
        done = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
        steps = self.steps(fix, messages) if fix is not None else []
        if done < len(steps) and steps[done][0] in offered:
            name, arguments = steps[done]
            self.tool_calls.append((name, arguments))
            call = {"id": f"call_{self.calls}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            text = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
            return self._generation(messages, text, message, "tool_calls")
        return self._generation(messages, self.text, {"role": "assistant", "content": self.text}, "stop")


# -- the task the tests use, and running a recipe's driver on it ---------------------------------

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tests" / "recipes" / "harness_task" / "tasks.jsonl"  # SWE-bench's layout, one task
MEAN_FIX = Fix(
    "mean() is wrong",
    "stats_lib/stats.py",
    "    return total(values) / (len(values) - 1)",
    "    return total(values) / len(values)",
)


def load_tasks() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]


def working_copy(task: dict[str, Any], where: Path) -> Path:
    """A fresh copy of the task's repository (what the sandbox gives an attempt)."""
    return Path(shutil.copytree(REPO / task["repo"], where / "repo"))


def hidden_test_outcomes(task: dict[str, Any], workdir: Path) -> dict[str, bool]:
    """Copy the task's hidden tests into `workdir` and run them: node id -> passed."""
    shutil.copytree(REPO / task["tests"], workdir / "tests")
    report = workdir / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "tests"],
        cwd=workdir, capture_output=True, timeout=120,
    )  # fmt: skip
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        node = f"tests/{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        outcomes[node] = not any(child.tag in ("failure", "error") for child in case)
    return outcomes


def run_driver(
    driver: Path, workdir: Path, task: dict[str, Any], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run a recipe's driver as alight's command agent does: in the working copy, the task in
    ALIGHT_TASK_FILE, `env` (the attempt's route, key and model) and nothing else but PATH."""
    task_file = workdir.parent / "task.json"
    task_file.write_text(json.dumps(task))
    full = {"PATH": os.environ["PATH"], "ALIGHT_TASK_FILE": str(task_file), **env}
    return subprocess.run([str(driver)], cwd=workdir, env=full, capture_output=True, text=True, timeout=180)
