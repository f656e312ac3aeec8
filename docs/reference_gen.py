"""The generated references: the CLI from the Typer app, the config from its dataclasses, the Python
API from `alight.__all__` (rendered by mkdocstrings). docs/hooks.py puts them into the pages at build
time; tests/docs/test_reference.py reads the same introspection to check them."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- the config ------------------------------------------------------------------------------------


@dataclass
class ConfigField:
    path: str  # YAML path, e.g. engine.sampling.max_tokens
    type: str  # the annotation as written in schema.py
    default: str  # YAML rendering of the default ("" for a nested group)
    doc: str  # the comment lines above the field and its trailing comment, joined
    group: str | None = None  # the nested group's path when the field is a group


@dataclass
class ConfigGroup:
    path: str  # YAML path of the group ("" for the top level)
    cls: str  # the dataclass's name
    fields: list[ConfigField]


def field_comments(source: str, class_name: str) -> dict[str, str]:
    """Each field of `class_name`: its comment lines right above, then the comments on its own lines."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    docs: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        own = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        docs[node.target.id] = " ".join(part for part in [*above, *own] if part)
    return docs


def _annotations(source: str, class_name: str) -> dict[str, str]:
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {
        node.target.id: ast.unparse(node.annotation)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def _yaml_value(value: Any) -> str:
    return json.dumps(value, default=str) if value is not None else "null"


def config_groups(root: type | None = None, path: str = "") -> list[ConfigGroup]:
    """Every config group, the top level first, each nested group after the group that holds it."""
    import inspect

    from alight.config.schema import ExperimentConfig

    cls = root or ExperimentConfig
    source = Path(inspect.getfile(cls)).read_text()
    docs, types = field_comments(source, cls.__name__), _annotations(source, cls.__name__)
    fields: list[ConfigField] = []
    nested: list[ConfigGroup] = []
    for f in dataclasses.fields(cls):
        full = f"{path}.{f.name}" if path else f.name
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(value):
            fields.append(ConfigField(full, types[f.name], "", docs.get(f.name, ""), group=full))
            nested.extend(config_groups(type(value), full))
        else:
            fields.append(ConfigField(full, types[f.name], _yaml_value(value), docs.get(f.name, "")))
    return [ConfigGroup(path, cls.__name__, fields), *nested]


def anchor(path: str) -> str:
    """The anchor of a config group or field (its YAML path, `engine.sampling`) or CLI command (`alight-train`)."""
    return path.replace(" ", "-") or "top-level"


def escape(text: str) -> str:
    """Markdown-safe prose for a table cell: code spans kept, markup characters escaped outside them."""
    parts = text.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_|\[\]<>])", r"\\\1", parts[i])
    return "`".join(parts)


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def config_markdown() -> str:
    """The config reference: one table per group, with an anchor per group and per field."""
    out: list[str] = []
    for group in config_groups():
        title = group.path or "Top level"
        out += [f"## {title} {{#{anchor(group.path)}}}", "", f"`{group.cls}`", ""]
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in group.fields:
            # a group's own heading is its anchor; a plain field gets one on its row
            key = f"`{f.path}`" if f.group else f'<a id="{anchor(f.path)}"></a>`{f.path}`'
            type_ = f"[`{f.type}`](#{anchor(f.group)})" if f.group else _code(f.type)  # a group: its table below
            out.append(f"| {key} | {type_} | {_code(f.default)} | {escape(f.doc)} |")
        out.append("")
    return "\n".join(out)


# --- the CLI ----------------------------------------------------------------------------------------


@dataclass
class CliParam:
    names: str  # how it is written: `--run-dir`, `--no-dashboard / --json`, or an argument's NAME
    kind: str  # argument | option
    type: str
    default: str
    required: bool
    help: str


@dataclass
class CliCommand:
    path: str  # "alight", "alight train"
    help: str
    params: list[CliParam]
    usage: str  # alight train [OPTIONS] CONFIG [OVERRIDES]...


def _param(param: Any, ctx: Any) -> CliParam:
    kind = param.param_type_name
    names = param.name.upper() if kind == "argument" else " / ".join([*param.opts, *param.secondary_opts])
    type_ = "flag" if getattr(param, "is_flag", False) else param.display_type(ctx).strip("<>")
    bounds = [f"x >= {param.min}"] if param.min is not None else []
    bounds += [f"x <= {param.max}"] if param.max is not None else []
    if bounds:
        type_ = f"{type_.replace(' range', '')} ({', '.join(bounds)})"
    if param.multiple or param.nargs == -1:  # `list[str]` in Typer's words: one value per use, or many
        type_ = re.sub(r"^list\[(.*)\]$", r"\1", type_) + ", repeatable"
    shown = param.show_default is not False and param.default is not None and not param.required
    default = json.dumps(param.default, default=str) if shown else ""
    return CliParam(names, kind, type_, default, bool(param.required), " ".join((param.help or "").split()))


def cli_commands(app: Any = None) -> list[CliCommand]:
    """The root and every command and sub-command (depth first), as the Typer app defines them."""
    import typer

    if app is None:
        from alight.cli.app import app
    root = typer.main.get_command(app)
    found: list[CliCommand] = []

    def visit(command: Any, ctx: Any) -> None:
        params = [_param(p, ctx) for p in command.get_params(ctx) if p.name != "help"]
        subcommands: list[str] = getattr(command, "list_commands", lambda _ctx: [])(ctx)
        usage = [ctx.command_path, "[OPTIONS]" if any(p.kind == "option" for p in params) else ""]
        for p in params:
            if p.kind == "argument":
                many = "..." if "repeatable" in p.type else ""
                usage.append(f"{p.names}{many}" if p.required else f"[{p.names}]{many}")
        usage.append("COMMAND" if subcommands else "")
        found.append(CliCommand(ctx.command_path, (command.help or "").strip(), params, " ".join(filter(None, usage))))
        for name in subcommands:
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                visit(sub, typer.Context(sub, info_name=name, parent=ctx))

    visit(root, typer.Context(root, info_name=root.name or "alight"))
    return found


def cli_markdown(app: Any = None) -> str:
    """The CLI reference: a section per command, its help, then its arguments and options."""
    out: list[str] = []
    for command in cli_commands(app):
        out += [f"## {command.path} {{#{anchor(command.path)}}}", "", "```text", command.usage, "```", ""]
        out += [escape(paragraph) + "\n" for paragraph in re.split(r"\n\s*\n", command.help) if paragraph]
        if command.params:
            out += ["| argument / option | type | default | meaning |", "| --- | --- | --- | --- |"]
            for p in command.params:
                default = "required" if p.required else _code(p.default)
                out.append(f"| `{p.names}` | {_code(p.type)} | {default} | {escape(p.help)} |")
            out.append("")
    return "\n".join(out)


# --- the Python API ---------------------------------------------------------------------------------

#: Modules whose names `alight.__all__` re-exports, in the order the page shows them, with a title.
API_SECTIONS = {
    "alight.agent": "Agents",
    "alight.tracing": "Tracing and rewards",
    "alight.types": "The data model",
    "alight.store": "Stores",
    "alight.trainer": "Training",
    "alight.config": "Configuration",
    "alight.errors": "Errors",
}

#: Sections whose classes show every public member, documented or not (pydantic models, enums).
SHOW_FIELDS = {"alight.types"}


def api_names() -> dict[str, list[str]]:
    """Each name of `alight.__all__` (but `__version__`) under the module it is exported from; the errors
    section also takes every error class of `alight.errors`, as a user catches them."""
    import inspect

    import alight
    from alight import errors

    sections: dict[str, list[str]] = {module: [] for module in API_SECTIONS}
    for name in alight.__all__:
        if name != "__version__":
            sections.setdefault(alight._EXPORTS[name], []).append(name)
    sections["alight.errors"] += [
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, errors.AlightError)
        and obj.__module__ == errors.__name__
        and name not in sections["alight.errors"]
    ]
    return sections


def api_markdown() -> str:
    """The API reference: a mkdocstrings directive per name (where it is defined: what griffe reads), each
    under an anchor `alight.NAME` (`alight.errors.NAME` for the errors `alight` does not export)."""
    import alight
    from alight import errors

    out: list[str] = []
    for module, names in api_names().items():
        out += [f"## {API_SECTIONS.get(module, module)}", ""]
        for name in names:
            obj = getattr(alight, name) if name in alight.__all__ else getattr(errors, name)
            short = f"alight.{name}" if name in alight.__all__ else f"alight.errors.{name}"
            out += [f'<a id="{short}"></a>', "", f"::: {obj.__module__}.{obj.__qualname__}"]
            # the data model's fields carry no docstrings; their names and types are what a user reads
            out += ["    options:", "      show_if_no_docstring: true"] if module in SHOW_FIELDS else []
            out.append("")
    return "\n".join(out)


# --- what the completeness test checks ---------------------------------------------------------------


def undocumented_config(root: type | None = None) -> list[str]:
    """YAML paths of the config fields with no comment."""
    return [f.path for group in config_groups(root) for f in group.fields if not f.doc]


def undocumented_cli(app: Any = None) -> list[str]:
    """Commands, arguments and options with no help text, as `alight train --resume`."""
    missing: list[str] = []
    for command in cli_commands(app):
        missing += [command.path] if not command.help else []
        missing += [f"{command.path} {p.names}" for p in command.params if not p.help]
    return missing
