"""MkDocs hooks: the reference pages' generated parts (docs/reference_gen.py), made at build time.

A reference page under docs/reference/ carries a marker, `<!-- generated: cli -->`, that the build
replaces with what the Typer app, the config dataclasses or `alight.__all__` define."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import reference_gen

GENERATORS = {
    "reference/cli.md": ("cli", reference_gen.cli_markdown),
    "reference/config.md": ("config", reference_gen.config_markdown),
    "reference/api.md": ("api", reference_gen.api_markdown),
}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace a reference page's marker with the generated reference; a page without it fails the build."""
    generator = GENERATORS.get(page.file.src_uri)
    if generator is None:
        return markdown
    name, make = generator
    marker = f"<!-- generated: {name} -->"
    if marker not in markdown:
        raise ValueError(f"docs/{page.file.src_uri} lost its marker {marker}: the reference has nowhere to go")
    return markdown.replace(marker, make())
