"""The docs' examples: every fenced `bash`, `sh`, `console` or `python` block of a page, and how each is checked.

An example is one of (an HTML comment on the line right before its opening fence says which; none means runnable):

- runnable: bash runs with `bash -euo pipefail` from (a scratch copy of) the repository root in under 60 s,
  python as a complete script with the repository's `src` on PYTHONPATH;
- `<!-- example: covered tests/path/test_x.py::test_name -->`: that test exists, and its source (or that of the
  helpers, fixtures and constants it names in the same file) contains every argument after the program name;
- `<!-- example: gpu -->` / `<!-- example: network -->`: the paragraph right before says "GPU" / "network";
- README's `<!-- test-command -->` block: CI's command, which .ci/run runs; never run here.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = frozenset({"bash", "sh", "console", "python"})
KINDS = ("runnable", "covered", "gpu", "network")
#: README's `<!-- test-command -->` block is CI's own command (.ci/run runs it), so it is never run here.
TEST_COMMAND = "test-command"
TIMEOUT_S = 60
#: Commands a runnable example may not run here: they reach the network, change the machine's packages, start a
#: daemon that outlives the example (`ray start`), or run the test suite inside itself. Such an example is
#: marked `network` (or `covered`) instead, and never run.
REFUSED = re.compile(
    r"(?:^|[\s;&|({])(?:pip3? (?:install|download)|python[\d.]* -m (?:pip|venv|pytest)\b|uv (?:pip|sync)|apt(?:-get)? "
    r"|npm |ray start|\S*install\.sh|curl |wget |git clone|huggingface-cli |hf download|pytest\b|\.ci/)",
    re.MULTILINE,
)
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")
#: The word the paragraph before a `gpu` / `network` block must contain (the pattern, and how it reads).
NEEDS = {"gpu": (re.compile(r"GPU"), '"GPU"'), "network": (re.compile(r"network", re.IGNORECASE), '"network"')}


@dataclass(frozen=True)
class Example:
    """One fenced example block: where it is, its language and code, its marker and the paragraph before it."""

    page: str  # the id's file part: a path under docs/, or README.md
    line: int  # the opening fence's line (1-based)
    language: str
    code: str
    marker: str | None  # the marker comment's body ("covered tests/x.py::test_y"), None without one
    paragraph: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        return "runnable" if self.marker is None else self.marker.split()[0]


def parse_page(text: str, page: str) -> list[Example]:
    """The example blocks of one markdown page, in order (blocks of other languages are skipped)."""
    lines = text.splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or not opening["info"].strip():
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        language = opening["info"].strip().split()[0].strip("{}.").lower()
        if language in LANGUAGES:
            code = "\n".join(
                line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[i + 1 : end]
            )
            above = lines[i - 1].strip() if i > 0 else ""
            marker = MARKER.match(above)
            body = marker["body"] if marker else (TEST_COMMAND if above == f"<!-- {TEST_COMMAND} -->" else None)
            start = i - 1 if body else i
            found.append(Example(page, i + 1, language, code + "\n", body, _paragraph(lines, start)))
        i = end + 1
    return found


def _paragraph(lines: list[str], before: int) -> str:
    """The paragraph that ends right above line index `before` (blank lines between are skipped)."""
    i = before - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    paragraph: list[str] = []
    while i >= 0 and lines[i].strip() and not FENCE.match(lines[i]):
        paragraph.insert(0, lines[i].strip())
        i -= 1
    return " ".join(paragraph)


def collect(docs: Path, readme: Path | None) -> list[Example]:
    """Every example of `docs/**/*.md` (ids relative to `docs`), then of `readme` (ids `README.md:LINE`)."""
    pages = [(path, path.relative_to(docs).as_posix()) for path in sorted(docs.rglob("*.md"))]
    if readme is not None and readme.is_file():
        pages.append((readme, readme.name))
    return [example for path, page in pages for example in parse_page(path.read_text(encoding="utf-8"), page)]


def problem(example: Example, root: Path, workdir: Path) -> str | None:
    """What is wrong with `example` (None when nothing): it fails, its test is missing, or its marker is wrong.
    `root` is the repository the markers' test paths are relative to; runnable examples run in `workdir`."""
    if example.kind not in (*KINDS, TEST_COMMAND):
        return f"unknown example marker <!-- example: {example.marker} -->; one of: covered PATH::TEST, gpu, network"
    if example.kind == "runnable":
        if example.marker is not None:
            return "write no marker for a runnable example"
        return run(example, root, workdir)
    if example.kind == "covered":
        return check_covered(example, root)
    if example.kind == TEST_COMMAND:
        return None if example.page == "README.md" else "only README.md has the test command (.ci/run reads it)"
    word_pattern, word = NEEDS[example.kind]
    if example.marker != example.kind:
        return f"the {example.kind} marker takes no argument: <!-- example: {example.kind} -->"
    if not word_pattern.search(example.paragraph):
        return f"the paragraph before a {example.kind} example must say it needs one: it never says {word}"
    return None


def check_covered(example: Example, root: Path) -> str | None:
    parts = example.marker.split() if example.marker else []
    if len(parts) != 2 or "::" not in parts[1]:
        return "write the covering test as <!-- example: covered tests/path/test_x.py::test_name -->"
    path_text, name = parts[1].split("::", 1)
    path = root / path_text
    if not path.is_file():
        return f"covered by {parts[1]}: no file {path_text}"
    source = source_of_test(path.read_text(encoding="utf-8"), name)
    if source is None:
        return f"covered by {parts[1]}: {path_text} has no test {name}"
    if example.language == "python":
        return None
    missing = [arg for arg in command_arguments(example) if arg not in source]
    if missing:
        return f"covered by {parts[1]}, but that test never passes {', '.join(repr(arg) for arg in missing)}"
    return None


def command_arguments(example: Example) -> list[str]:
    """The arguments after the program name of every command in a shell block (`$ ` lines of a console block)."""
    text = example.code.replace("\\\n", " ")
    lines = text.splitlines()
    if example.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    args: list[str] = []
    for line in lines:
        for command in re.split(r"\s(?:&&|\|\||;|\|)\s", line):
            words = shlex.split(command, comments=True)
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value before the program
                words.pop(0)
            args += words[1:]
    return args


def source_of_test(module: str, name: str) -> str | None:
    """The source of test `name` (`Class::test` for a method) in `module`, with that of the module-level
    functions, fixtures and constants it names, and theirs in turn; None when there is no such test."""
    tree = ast.parse(module)
    top: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            top[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            top.update({target.id: node for target in targets if isinstance(target, ast.Name)})
    test: ast.stmt | None = top.get(name.split("::")[0])
    for method in name.split("::")[1:]:
        body = test.body if isinstance(test, ast.ClassDef) else []
        test = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == method), None
        )
    if not isinstance(test, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    seen, sources = {id(test)}, []
    todo: list[ast.stmt] = [test]
    while todo:
        node = todo.pop()
        sources.append(ast.get_source_segment(module, node) or "")
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        for referenced in sorted(names):
            target = top.get(referenced)
            if target is not None and id(target) not in seen:
                seen.add(id(target))
                todo.append(target)
    return "\n".join(sources)


def run(example: Example, root: Path, workdir: Path) -> str | None:
    """Run a runnable example in `workdir` (a scratch root where `root`'s entries are linked); None when it passes."""
    home = workdir.parent / "home"
    home.mkdir(exist_ok=True)
    src = str(root / "src")
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(workdir.parent),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    script = example.code
    refused = REFUSED.search(script) if example.language != "python" else None
    if refused:
        return (
            f"runs {refused[0].strip()!r}: the network, the machine's packages or the test suite, never run here;"
            " mark it <!-- example: network --> (and say so) or covered by the test that runs it"
        )
    if example.language == "console":
        commands = [line[2:] for line in script.splitlines() if line.startswith("$ ")]
        script = "\n".join(commands) + "\n" if commands else script
    suffix = ".py" if example.language == "python" else ".sh"
    file = workdir.parent / f"example-{example.line}{suffix}"
    file.write_text(script, encoding="utf-8")
    command = [sys.executable, str(file)] if example.language == "python" else ["bash", "-euo", "pipefail", str(file)]
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its servers and runners too
        output, _ = process.communicate()
        return f"ran past {TIMEOUT_S} s (mark a long command covered by the test that runs it):\n{output[-3000:]}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    if process.returncode != 0:
        return f"exited {process.returncode}:\n{output[-3000:]}"
    return None


def scratch_root(root: Path, into: Path) -> Path:
    """A folder in `into` that looks like the repository root (each top-level entry linked, but not `runs`),
    so that examples find configs/ and recipes/ while the run directories they write stay out of the tree."""
    workdir = into / "repo"
    workdir.mkdir(parents=True)
    for entry in root.iterdir():
        if entry.name not in {".git", "runs", "site"}:
            (workdir / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return workdir
