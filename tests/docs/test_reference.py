"""The generated references (docs/reference_gen.py): every config field and CLI option is documented,
and the pages show every one of them, checked against the dataclasses and the Typer app directly."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import pytest
import typer

import alight.errors

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS))

import hooks  # noqa: E402  (docs/ is not a package)
import reference_gen as gen  # noqa: E402

from alight import __all__ as exported  # noqa: E402
from alight.cli.app import app  # noqa: E402
from alight.config.schema import ExperimentConfig  # noqa: E402


def test_every_config_field_has_a_documentation_line() -> None:
    missing = gen.undocumented_config()
    assert not missing, "config fields with no comment in src/alight/config/schema.py: " + ", ".join(missing)


def test_every_cli_command_option_and_argument_has_help() -> None:
    missing = gen.undocumented_cli()
    assert not missing, "CLI commands, arguments and options with no help: " + ", ".join(missing)


@dataclass
class _Inner:
    depth: int = 2  # documented


@dataclass
class _Undocumented:
    # the comment above documents `above`
    above: int = 1
    trailing: str = "x"  # documented on its line
    bare: float = 0.5
    spread: str = (
        "a default too long for one line with its comment"  # a comment inside the statement, on a later line, counts
    )
    inner: _Inner = field(default_factory=_Inner)
    documented_group: _Inner = field(default_factory=_Inner)  # a group documented on its line
    # a comment before a blank line is not the next field's

    blank_apart: int = 0


def test_the_checks_name_what_has_no_documentation() -> None:
    assert gen.undocumented_config(_Undocumented) == ["bare", "inner", "blank_apart"]
    groups = {group.path: group for group in gen.config_groups(_Undocumented)}
    assert set(groups) == {"", "inner", "documented_group"}
    docs = {f.path: f.doc for group in groups.values() for f in group.fields}
    assert docs["above"] == "the comment above documents `above`"
    assert docs["trailing"] == "documented on its line"
    assert docs["spread"] == "a comment inside the statement, on a later line, counts"
    assert docs["inner.depth"] == "documented"

    small = typer.Typer(name="small")

    @small.command()
    def go(
        target: Annotated[str, typer.Argument()],
        fast: Annotated[bool, typer.Option(help="Go fast.")] = False,
        slow: Annotated[int, typer.Option()] = 1,
    ) -> None:
        pass

    @small.command()
    def stop() -> None:
        """Stop."""

    assert gen.undocumented_cli(small) == ["small", "small go", "small go TARGET", "small go --slow"]


def _config_leaves(cls: type, prefix: str = "") -> tuple[list[str], dict[str, Any]]:
    """Independently of the generator: each group's path and each plain field's default."""
    groups: list[str] = [prefix]
    leaves: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value):
            sub_groups, sub_leaves = _config_leaves(type(value), path)
            groups += sub_groups
            leaves |= sub_leaves
        else:
            leaves[path] = value
    return groups, leaves


def _sections(markdown: str) -> dict[str, str]:
    """A page's `## ... {#anchor}` sections by anchor."""
    parts = re.split(r"^## .*\{#(\S+)\}$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_config_page_shows_every_group_and_field_with_its_default() -> None:
    groups, leaves = _config_leaves(ExperimentConfig)
    sections = _sections(gen.config_markdown())
    assert set(sections) == {group or "top-level" for group in groups}
    assert "engine.sampling" in sections and "algorithm.apo.optimizer.sampling" in sections
    for path, default in leaves.items():
        group = path.rpartition(".")[0] or "top-level"
        row = next((line for line in sections[group].splitlines() if f'<a id="{path}"></a>' in line), None)
        assert row is not None, f"{path} is not in the table of {group}"
        shown = "null" if default is None else json.dumps(default)
        assert f"| `{shown}` |" in row, f"{path}: the default {shown} is not shown in {row}"


def test_the_cli_page_shows_every_command_option_and_argument() -> None:
    root: Any = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="alight")
    sections = _sections(gen.cli_markdown())
    assert "\nalight train [OPTIONS] CONFIG [OVERRIDES]...\n" in sections["alight-train"]
    assert "\nalight [OPTIONS] COMMAND\n" in sections["alight"]
    assert "\nalight runner [OPTIONS]\n" in sections["alight-runner"]
    commands = {"alight": root} | {f"alight {name}": root.get_command(ctx, name) for name in root.list_commands(ctx)}
    assert set(sections) == {path.replace(" ", "-") for path in commands}
    for path, command in commands.items():
        section = sections[path.replace(" ", "-")]
        assert (command.help or "").split("\n")[0].strip().rstrip(".")[:40] in section.replace("\\", "")
        for param in command.params:
            if param.name == "help":
                continue
            names = [param.name.upper()] if param.param_type_name == "argument" else param.opts + param.secondary_opts
            rows = [line for line in section.splitlines() if line.startswith("| `")]
            row = next((r for r in rows if set(names) <= set(re.findall(r"[-\w]+", r.split("|")[1]))), None)
            assert row is not None, f"{path}: {names} are not in its table"
            assert param.help.split()[0] in row


def test_the_api_page_documents_every_name_alight_exports_and_every_error() -> None:
    page = gen.api_markdown()
    directives = re.findall(r"^::: (\S+)$", page, flags=re.M)
    anchors = re.findall(r'^<a id="([\w.]+)"></a>$', page, flags=re.M)
    errors = [name for name, obj in vars(alight.errors).items() if isinstance(obj, type) and name.endswith("Error")]
    assert "ConfigError" in errors and "AlightError" in errors
    documented = {n for n in exported if n != "__version__"} | set(errors)
    assert sorted(d.rsplit(".", 1)[1] for d in directives) == sorted(documented)
    assert {f"alight.{n}" for n in exported if n != "__version__"} <= set(anchors)
    assert "alight.errors.ConfigError" in anchors
    assert "alight.trainer.trainer.Trainer" in directives  # where it is defined: what griffe reads


@pytest.mark.parametrize("page", ["reference/cli.md", "reference/config.md", "reference/api.md"])
def test_a_reference_page_gets_its_generated_part_and_fails_without_its_marker(page: str) -> None:
    text = (DOCS / page).read_text()
    made = hooks.on_page_markdown(text, page=SimpleNamespace(file=SimpleNamespace(src_uri=page)))
    assert "<!-- generated:" not in made and len(made) > len(text) + 500
    with pytest.raises(ValueError, match="lost its marker"):
        hooks.on_page_markdown("# a page", page=SimpleNamespace(file=SimpleNamespace(src_uri=page)))
