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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


class CutModel(CodingModel):
    """A CodingModel whose last turn (after the fix, where it would sum up) is cut at max_tokens:
    a few words and finish_reason "length", as a small model's answer at a small max_tokens."""

    async def chat(self, request: ChatRequest) -> Generation:
        answer = await super().chat(request)
        if answer.finish_reason != "stop":
            return answer
        cut = "I changed the"
        return self._generation(request.messages, cut, {"role": "assistant", "content": cut}, "length")


# -- a trainable policy that is sometimes coached ---------------------------------------------------

#: Where a harness names the attempt's working copy: Claude Code's system reminder, Codex's environment context.
WORKDIR = re.compile(r"Primary working directory: (\S+)|<cwd>([^<]+)</cwd>")


def coached_engine(coach: CodingModel) -> type[Any]:
    """An EmbeddedEngine class (real weights, which the run trains and reloads) coached on a harness's
    attempts, in the order their working copies first reach it: the 1st, 3rd, ... take `coach`'s
    answers (they fix the task); the 2nd, 4th, ... the answers of a coach that knows no fix (it sums
    up at once: the task stays unfixed). In a train group of two, one attempt fixes the task and one
    does not, so the rewards differ and the update moves the policy. A coached answer is recorded as
    the engine's own would be: the prompt's token ids from the model's chat template (a prompt past
    the context fails), the answer's from its tokenizer (end token included), no log-probs (the
    trainer computes them), the serving weights' version. `calls` counts them."""
    from alight.engines.base import TextDelta
    from alight.engines.embedded import EmbeddedEngine

    idle = CodingModel(coach.harness, [])

    class CoachedEngine(EmbeddedEngine):
        seen: dict[str, int] = {}  # noqa: RUF012 -- working copy -> its place, shared by the run's one engine
        calls = 0

        def _coach(self, request: ChatRequest) -> CodingModel:
            found = WORKDIR.search("\n".join(_text(m) for m in request.messages))
            assert found, "the harness names the attempt's working copy"
            place = self.seen.setdefault(found.group(1) or found.group(2), len(self.seen))
            return coach if place % 2 == 0 else idle

        async def chat(self, request: ChatRequest) -> Generation:
            type(self).calls += 1
            sequence, _ = await self._prepare_chat(request)
            answer = await self._coach(request).chat(request)
            ids = [*self.tokenizer.encode(answer.text, add_special_tokens=False), self.tokenizer.eos_token_id]
            return Generation(
                model=self.model_names[0], text=answer.text, message=answer.message,
                finish_reason=answer.finish_reason, prompt_token_ids=list(sequence.prompt_ids),
                response_token_ids=ids, prompt_tokens=len(sequence.prompt_ids), completion_tokens=len(ids),
                weights_version=self.weights_version,
            )  # fmt: skip

        async def chat_stream(self, request: ChatRequest) -> Any:
            answer = await self.chat(request)
            if answer.message.get("content"):
                yield TextDelta(answer.message["content"])
            yield answer

    return CoachedEngine
