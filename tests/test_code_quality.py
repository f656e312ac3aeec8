"""ruff and mypy stay clean, and the package root stays light (STYLE.md)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the dev extra")
def test_ruff_is_clean() -> None:
    lint = _run("ruff", "check", "src", "tests", "benchmarks")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run("ruff", "format", "--check", "src", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # beside the suite's other workers on 2 cores
def test_mypy_is_clean() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_alight_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, alight, alight.store, alight.cli.app;"
        "heavy = {'torch', 'transformers', 'litellm', 'peft', 'datasets', 'verl', 'vllm', 'ray', 'fastapi',"
        " 'uvicorn', 'httpx', 'opentelemetry'} & {m.split('.')[0] for m in sys.modules};"
        "print(sorted(heavy))"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the import graph: the arrows table, no cycles --------------------------------------------

PACKAGE = ROOT / "src" / "alight"
#: Modules every part may use: the data model, errors, attribute names.
FOUNDATION = frozenset({"types", "errors", "semconv", "parts", "restarts"})
#: The alight parts each part may import (beyond FOUNDATION), as in docs/development.md's "The
#: parts and their arrows"; the small shared modules (chat_template, entrypoints, data, models,
#: serving) sit just above the foundation. "<root>" is alight/__init__.py (the public API).
ALLOWED: dict[str, frozenset[str]] = {
    part: frozenset(deps)
    for part, deps in {
        "types": set(),
        "errors": set(),
        "semconv": set(),
        "parts": set(),
        "restarts": set(),
        "chat_template": set(),
        "entrypoints": set(),
        "serving": set(),
        "shipped": set(),
        "config": {"models", "shipped"},  # models: the default model's name (TINY); shipped: configs by name
        "models": set(),
        "dashboard": set(),
        "data": {"entrypoints"},
        "store": {"serving", "config"},  # config: the store factory reads StoreConfig
        "engines": {"chat_template", "models", "config"},  # config: a kind's options from the engine section
        "adapters": {"chat_template"},
        "tracing": {"store"},
        "agent": {"entrypoints"},
        "sandbox": set(),
        "rewards": {"agent", "tracing", "sandbox", "engines", "config"},
        "command_agent": {"agent", "tracing", "sandbox", "rewards", "config"},
        "agent_setup": {"agent", "command_agent", "rewards", "config"},  # what runners run for a config's agent
        "algorithms": {"adapters", "store", "config", "entrypoints", "engines"},  # engines: APO's optimizer kind
        "proxy": {"store", "engines", "serving"},
        "backends": {"algorithms", "config", "models", "engines"},  # engines: what the engine kind can do
        "runner": {"store", "tracing", "agent", "serving", "config"},  # config: the pool factory reads RunnerConfig
        "trainer": {
            *("adapters", "agent_setup", "algorithms", "backends", "command_agent", "config", "data", "engines"),
            *("models", "proxy", "runner", "serving", "store"),
        },
        # the services of serve, trace, eval, the SFT export and dev's flags: over the trainer, not in it
        "commands": {
            *("trainer", "agent", "algorithms", "config", "data", "engines", "models", "proxy"),
            *("runner", "serving", "store"),  # serve starts an engine + proxy, a store server, a runner pool
        },
        "<root>": {"agent", "config", "store", "tracing", "trainer"},
        # models: the default model's name
        "cli": {"commands", "trainer", "agent_setup", "config", "dashboard", "models", "shipped", "<root>"},
        "__main__": {"cli"},
    }.items()
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["alight", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _part(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else "<root>"


def import_graph() -> dict[str, set[str]]:
    """Module -> the alight modules it imports: every import statement (inside functions and under
    TYPE_CHECKING too), `from package import submodule` resolved to the submodule."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for name in names:
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in modules and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_imports_follow_the_design_arrows() -> None:
    graph = import_graph()
    against = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _part(target) != _part(module)
        and _part(target) not in FOUNDATION
        and _part(target) not in ALLOWED.get(_part(module), frozenset())
    )
    assert not against, "imports against the arrows table:\n" + "\n".join(against)
    assert not set(map(_part, graph)) - set(ALLOWED), "a part missing from ALLOWED: place it in the design first"


def test_every_allowed_arrow_is_used() -> None:
    """The table says what the code does, no more: an arrow nothing uses is dropped from it (and
    from docs/development.md's), so the table stays a map of the code."""
    used: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        used.setdefault(_part(module), set()).update(_part(t) for t in targets)
    unused = {part: sorted(set(deps) - used.get(part, set())) for part, deps in ALLOWED.items()}
    assert not {part: deps for part, deps in unused.items() if deps}


def test_no_import_cycles_between_parts_or_modules() -> None:
    graph = import_graph()
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        parts.setdefault(_part(module), set()).update(_part(t) for t in targets if _part(t) != _part(module))
    assert _cycles(parts) == []
    assert _cycles({part: set(deps) for part, deps in ALLOWED.items()}) == []  # the design itself is a DAG
    assert _cycles(graph) == [], "import cycles (also through imports inside functions)"


def test_the_import_graph_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks above fail when they should: the reader finds imports inside functions, relative
    imports and submodules named in `from package import name`, and `_cycles` finds a cycle."""
    graph = import_graph()
    assert "alight.trainer.loops" in graph["alight.trainer.trainer"] or any(
        t.startswith("alight.trainer.") for t in graph["alight.trainer.trainer"]
    )
    assert "alight.store.sqlite" in graph["alight.store"]  # inside a function of store/__init__.py
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# -- one contract for every replaceable part -------------------------------------------------------

#: A config section whose `kind` (or `backend`) chooses a part's kind -> the part that owns it.
KIND_OWNERS = {
    "engine": "engines",
    "optimizer": "engines",  # algorithm.apo.optimizer: an engine section
    "store": "stores",
    "store_spec": "store",
    "sandbox": "sandbox",
    "reward": "rewards",
    "runner": "runner",
    "trainer": "backends",
}


def _strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and bool(node.elts) and all(map(_strings, node.elts))


def _kind_owner(node: ast.AST) -> str | None:
    """The part whose kind `node` reads (`cfg.engine.kind` -> engines), None when it reads no part's
    kind (a span's, a message's, a credential's kind is data, not a part)."""
    if isinstance(node, ast.Attribute) and node.attr in ("kind", "backend"):
        section = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        owner = KIND_OWNERS.get(section)
        return "store" if owner == "stores" else owner
    return None


def test_no_part_kind_is_compared_to_a_string_outside_its_part() -> None:
    """What others ask of a kind is its class's answer (a capability), never its name's."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        part = _part(".".join(["alight", *path.relative_to(PACKAGE).with_suffix("").parts]))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(map(_strings, sides)):
                continue
            for side in sides:
                owner = _kind_owner(side)
                if owner is None or owner == part:
                    continue
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "a part's kind compared to a string outside its part:\n" + "\n".join(found)


def test_the_tiny_model_is_named_in_one_place() -> None:
    named = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "tiny"
    ]
    assert len(named) == 1 and named[0].startswith("models/resolve.py:"), named  # TINY, the resolver's


#: Module and function sizes (lines, docstrings included): past them a file or function holds two things.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def test_no_module_or_function_is_too_long() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {size} lines")
    assert not long, "split these:\n" + "\n".join(sorted(long))


#: The map of the parts a reader meets: docs/development.md's "The parts and their arrows" (the
#: team's ../shared/DESIGN.md is a note outside the repository, read-only here: not tested).
ARROWS_DOC = ROOT / "docs" / "development.md"


def arrows_section(text: str) -> str:
    """The "## The parts and their arrows" section of a page, up to the next "## " heading."""
    _, found, rest = text.partition("## The parts and their arrows\n")
    assert found, "docs/development.md has no 'The parts and their arrows' section"
    return rest.split("\n## ", 1)[0]


def design_table(text: str) -> dict[str, frozenset[str]]:
    """DESIGN.md's parts table as {part: the parts it may import}: the first column's parts, the
    third column's names ("—": none; "part: a, b; other: c" where a row's parts differ; words in
    parentheses are notes)."""
    table: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        parts = [name.strip("`/ ") for name in cells[0].split(",")]
        imports = re.sub(r"\([^)]*\)", "", cells[2])

        def names(text: str) -> frozenset[str]:
            return frozenset(n.strip(" `/") for n in text.split(",") if n.strip(" `/") not in ("", "—"))

        if ":" in imports:
            for clause in imports.split(";"):
                part, _, listed = clause.partition(":")
                table[part.strip(" `/")] = names(listed)
        else:
            table.update({part: names(imports) for part in parts})
    return table


def test_the_docs_parts_table_is_the_import_table() -> None:
    assert design_table(arrows_section(ARROWS_DOC.read_text())) == ALLOWED


def test_the_design_table_reader_reads_every_form_of_row() -> None:
    text = (
        "| part | owns | may import |\n| --- | --- | --- |\n"
        "| `a`, `b` | x | — |\n| `c/` | y | a, b (why) |\n| `d`, `e` | z | d: a; e: a, c |\n"
    )
    assert design_table(text) == {
        "a": frozenset(), "b": frozenset(), "c": {"a", "b"}, "d": {"a"}, "e": {"a", "c"},
    }  # fmt: skip


#: Parameter names that mean one of alight's own collaborators (Engine, Store, Backend, Policy,
#: LocalStack, RunSession, Proxy, Watchers, AdapterStats, ChatTokenizer, Sandbox, Pool); `watchers`
#: is not one: a watcher has only some of TrainerEvents' methods, so it stays Any.
COLLABORATORS = frozenset(
    {
        *("engine", "store", "backend", "policy", "stack", "session", "proxy", "events", "stats", "tokenizer"),
        *("sandbox", "box", "pool"),
    }
)
#: Where such a name means a third-party object instead: (module path prefix, name).
THIRD_PARTY_NAMES = frozenset(
    {
        # a Hugging Face tokenizer: models/ sits below chat_template, where alight's ChatTokenizer is
        ("models/", "tokenizer"),
        ("tracing/", "session"),  # an aiohttp ClientSession being instrumented
        ("backends/verl/", "pool"),  # a Ray resource pool
    }
)


def _bare_any(annotation: ast.expr) -> bool:
    """`Any`, `"Any"`, `Any | None` or `Optional[Any]`."""
    text = ast.unparse(annotation).replace("'", "").replace('"', "")
    return text in ("Any", "typing.Any", "Any | None", "None | Any", "Optional[Any]")


def bare_any_collaborators(package: Path) -> list[str]:
    """Parameters named like an in-house collaborator but annotated bare `Any`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if arg.arg not in COLLABORATORS or arg.annotation is None or not _bare_any(arg.annotation):
                    continue
                if any(rel.startswith(prefix) and arg.arg == name for prefix, name in THIRD_PARTY_NAMES):
                    continue
                found.append(f"{rel}:{arg.lineno} {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
    return found


def test_in_house_collaborators_are_typed_not_any(tmp_path: Path) -> None:
    """A parameter named like one of alight's own collaborators has that type, not `Any` (issue 43);
    a watcher (some of TrainerEvents' methods), a JSON payload or a third-party object keeps `Any`."""
    found = bare_any_collaborators(PACKAGE)
    assert not found, "type these with alight's own class (or add a third-party exception):\n" + "\n".join(found)
    (tmp_path / "models").mkdir()
    (tmp_path / "a.py").write_text(
        "def f(store: Any, engine: 'Any', stats: Any | None, *, events: Optional[Any] = None, ok: Any = 1):\n    pass\n"
    )
    (tmp_path / "models" / "b.py").write_text("async def g(tokenizer: Any, stack: Any) -> None: ...\n")
    assert [line.split(" ", 1)[1] for line in bare_any_collaborators(tmp_path)] == [
        "f(store: Any)", "f(engine: 'Any')", "f(stats: Any | None)", "f(events: Optional[Any])", "g(stack: Any)",
    ]  # fmt: skip
