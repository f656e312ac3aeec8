"""A scripted coding model for the harness recipes (codex_cli, claude_code): a test fixture that
plays a competent model through alight's proxy, standing in for an LLM that can code (no model that
runs here can drive a coding agent).

It speaks chat completions; the proxy turns each harness's own API (Codex: Responses, Claude Code:
Anthropic Messages) into these calls and the answers back. For each task of the shared SWE set
(recipes/swe_tasks) whose issue it recognises, it knows the reference fix (the task's `fix.patch`) and
does what a competent model does with that harness's tools: it reads the file the issue is about,
edits it (Codex: Codex's `apply_patch` format through its `exec_command` shell tool; Claude Code:
`Read`, then an `Edit` per hunk, with the absolute path of the working directory that Claude Code
names in its system reminder), then ends with a summary. Any other request (a side call without
tools) gets a short text. Every request it answers is counted in `calls`, so a test can compare it
with the LLM spans the store holds.
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

SUMMARY = "Fixed it: the code now does what the issue asks."
REPO = Path(__file__).resolve().parents[2]
TASKS_FILE = REPO / "recipes" / "swe_tasks" / "tasks.jsonl"


@dataclass(frozen=True)
class Hunk:
    """One hunk of a reference fix: in `path` (relative to the repository), `old` becomes `new`."""

    path: str
    lines: tuple[str, ...]  # the hunk's lines, each with its diff prefix (" ", "-", "+")

    @property
    def old(self) -> str:
        return "\n".join(line[1:] for line in self.lines if line[0] in " -")

    @property
    def new(self) -> str:
        return "\n".join(line[1:] for line in self.lines if line[0] in " +")


def hunks_of(patch: str) -> list[Hunk]:
    """The hunks of a unified diff (paths a/..., b/...)."""
    hunks: list[Hunk] = []
    path, lines = "", list[str]()
    for line in [*patch.splitlines(), "@@ end"]:
        if line.startswith(("@@", "--- ", "+++ ")) and lines:
            hunks.append(Hunk(path, tuple(lines)))
            lines = []
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif not line.startswith(("@@", "--- ", "\\")):
            lines.append(line if line else " ")
    return hunks


def task_fix(task: dict[str, Any]) -> list[Hunk]:
    """The reference fix of a task of the shared set: `fix.patch` beside its `repo/`."""
    return hunks_of((Path(task["repo"]).parent / "fix.patch").read_text())


def codex_patch(hunks: list[Hunk]) -> str:
    """The shell command a Codex model sends to edit files: Codex's `apply_patch` format."""
    lines = ["*** Begin Patch"]
    for path in dict.fromkeys(hunk.path for hunk in hunks):
        lines.append(f"*** Update File: {path}")
        for hunk in (h for h in hunks if h.path == path):
            lines += ["@@", *hunk.lines]
    return "apply_patch <<'PATCH'\n" + "\n".join([*lines, "*** End Patch"]) + "\nPATCH\n"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


class CodingModel(ScriptedEngine):
    """Plays `harness` ("codex" or "claude") on `tasks` (rows of the shared set); see the module docstring."""

    name = "coding-model"

    def __init__(self, harness: str, tasks: list[dict[str, Any]], *, model: str = "policy") -> None:
        super().__init__(model=model, text=SUMMARY)
        self.harness = harness
        self.fixes = {task["problem_statement"].splitlines()[0]: task_fix(task) for task in tasks}  # issue title -> fix
        self.calls = 0
        self.tool_calls: list[tuple[str, dict[str, Any]]] = []  # every tool call it made, in order

    def steps(self, hunks: list[Hunk], messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls this harness's model makes to apply `hunks`, in order."""
        paths = list(dict.fromkeys(hunk.path for hunk in hunks))
        if self.harness == "codex":
            return [("exec_command", {"cmd": f"cat {' '.join(paths)}"}), ("exec_command", {"cmd": codex_patch(hunks)})]
        found = re.search(r"Primary working directory: (\S+)", "\n".join(_text(m) for m in messages))
        assert found, "Claude Code names its working directory in its system reminder"
        steps: list[tuple[str, dict[str, Any]]] = []
        for path in paths:
            absolute = f"{found.group(1)}/{path}"
            steps.append(("Read", {"file_path": absolute}))
            steps += [
                ("Edit", {"file_path": absolute, "old_string": hunk.old, "new_string": hunk.new})
                for hunk in hunks
                if hunk.path == path
            ]
        return steps

    async def chat(self, request: ChatRequest) -> Generation:
        self.calls += 1
        self.requests.append(request)
        messages = request.messages
        offered = {tool["function"]["name"] for tool in request.tools or []}
        conversation = "\n".join(_text(m) for m in messages if m["role"] == "user")
        hunks = next((fix for title, fix in self.fixes.items() if title in conversation), [])
        done = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
        steps = self.steps(hunks, messages) if hunks else []
        if done < len(steps) and steps[done][0] in offered:
            name, arguments = steps[done]
            self.tool_calls.append((name, arguments))
            call = {"id": f"call_{self.calls}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            text = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
            return self._generation(messages, text, message, "tool_calls")
        return self._generation(messages, self.text, {"role": "assistant", "content": self.text}, "stop")


# -- the shared task set, and running a recipe's driver on a task --------------------------------


def load_tasks(split: str | None = None) -> list[dict[str, Any]]:
    """The shared set's rows (recipes/swe_tasks), `repo` and `tests` absolute."""
    rows = [json.loads(line) for line in TASKS_FILE.read_text().splitlines() if line.strip()]
    for row in rows:
        row["repo"], row["tests"] = str(REPO / row["repo"]), str(REPO / row["tests"])
    return [row for row in rows if split is None or row["split"] == split]


def hidden_test_outcomes(task: dict[str, Any], workdir: Path) -> dict[str, bool]:
    """Copy the task's hidden tests into `workdir` (at its root, as the tests reward does) and run
    them: node id -> passed."""
    shutil.copytree(task["tests"], workdir, dirs_exist_ok=True)
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
    import asyncio

    from alight.config.loading import load_config, to_object
    from alight.errors import ConfigError
    from alight.proxy import Proxy, ProxyServer
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore
    from alight.trainer.stack import runner_agent
    from alight.types import LLMResource, Rollout, Task

    cfg = to_object(load_config(config))
    try:
        agent = runner_agent(cfg.agent, reward=cfg.reward)  # checks the sandbox as `alight train` does
    except ConfigError as err:
        import pytest

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
