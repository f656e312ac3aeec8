"""One version number everywhere. `alight.__version__` (src/alight/__init__.py) is the single source:
pyproject.toml declares the version dynamic and hatchling reads it from there into the wheel's and
the sdist's metadata. `alight --version` prints it, the installed distribution's metadata carries it,
and CHANGELOG.md's top entry agrees with it (`changelog_disagreement` says how)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

import alight
from tests.cli.in_process import alight_here

ROOT = Path(__file__).resolve().parents[1]
#: `## [Unreleased]`, or `## [1.2.0] - 2026-12-01` (Keep a Changelog's headings).
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")


def changelog_disagreement(version: str, changelog: str) -> str | None:
    """What is wrong between a version and a Keep-a-Changelog text, in one line; None: they agree.

    A development version (`0.2.0.dev0`) is work towards its release: the changelog opens with
    `## [Unreleased]`, and every released entry is older than it (`0.2.0` not released yet). A release
    (`0.2.0`, `0.2.0rc1`) has its own dated entry, `## [0.2.0] - YYYY-MM-DD`, the first released one
    (an `## [Unreleased]` above it, empty or not, is fine)."""
    headings = [found for line in changelog.splitlines() if (found := HEADING.match(line))]
    if not headings:
        return "the changelog has no `## [...]` heading"
    released = [h for h in headings if h["name"] != "Unreleased"]
    current = Version(version)
    if current.is_devrelease:
        if headings[0]["name"] != "Unreleased":
            return f"{version} is a development version: the changelog must open with `## [Unreleased]`"
        if released and Version(released[0]["name"]) >= current:
            return f"{released[0]['name']} is already released: {version} must be a later development version"
        return None
    if not released:
        return f"{version} is a release: the changelog has no `## [{version}] - YYYY-MM-DD` entry"
    top = released[0]
    if Version(top["name"]) != current:
        return f"the changelog's newest entry is {top['name']}, the version {version}"
    if top["date"] is None:
        return f"the entry for {version} has no date (`## [{version}] - YYYY-MM-DD`)"
    return None


@pytest.mark.parametrize(
    ("version", "changelog", "wrong"),
    [
        ("0.1.0.dev0", "# Changelog\n\n## [Unreleased]\n\n### Added\n- x\n", None),
        ("0.2.0.dev0", "## [Unreleased]\n- y\n\n## [0.1.0] - 2026-12-01\n- x\n", None),
        ("0.1.0.dev0", "## [Unreleased]\n\n## [0.1.0] - 2026-12-01\n", "0.1.0 is already released"),
        ("0.1.0.dev0", "## [0.0.9] - 2026-11-01\n", "must open with `## [Unreleased]`"),
        ("0.1.0", "## [Unreleased]\n\n## [0.1.0] - 2026-12-01\n- x\n", None),
        ("0.1.0", "## [0.1.0] - 2026-12-01\n## [0.0.9] - 2026-11-01\n", None),
        ("0.1.0rc1", "## [Unreleased]\n## [0.1.0rc1] - 2026-12-01\n", None),
        ("0.1.0", "## [Unreleased]\n- x\n", "no `## [0.1.0] - YYYY-MM-DD` entry"),
        ("0.1.1", "## [Unreleased]\n## [0.1.0] - 2026-12-01\n", "newest entry is 0.1.0, the version 0.1.1"),
        ("0.1.0", "## [0.1.0]\n- x\n", "has no date"),
        ("0.1.0", "# Changelog\n", "no `## [...]` heading"),
    ],
)
def test_the_changelog_rule(version: str, changelog: str, wrong: str | None) -> None:
    found = changelog_disagreement(version, changelog)
    if wrong is None:
        assert found is None
    else:
        assert found is not None and wrong in found, found


def test_the_changelog_agrees_with_the_version() -> None:
    assert changelog_disagreement(alight.__version__, (ROOT / "CHANGELOG.md").read_text()) is None


def test_the_version_has_one_source() -> None:
    version = alight.__version__
    assert str(Version(version)) == version, "not in PEP 440's normal form: pip and the wheel's name would differ"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    from hatchling.metadata.core import ProjectMetadata
    from hatchling.plugin.manager import PluginManager

    assert ProjectMetadata(str(ROOT), PluginManager()).version == version  # what a build writes


def test_the_installed_metadata_and_alight_version_agree() -> None:
    installed = importlib.metadata.version("alight")
    assert installed == alight.__version__, (
        f"the installed alight says {installed}, this checkout {alight.__version__}: reinstall it (pip install -e .)"
    )
    done = alight_here("--version")
    assert done.returncode == 0 and done.stdout == f"alight {alight.__version__}\n"
