"""constraints/cpu.txt pins the whole CPU install path: every package installed here, at its version.

CI installs with README's test command on a clean clone, so there this proves that the pins cover
everything pip resolved: a package that got in unpinned (a new dependency, an extra) fails here.
"""

from __future__ import annotations

import importlib.metadata
import re
import site
from pathlib import Path

import pytest
from packaging.specifiers import Specifier
from packaging.version import InvalidVersion, Version

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints" / "cpu.txt"
REFRESH = "python3.11 constraints/refresh.py"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
# alight is the project itself; the venv brings pip and nothing requires it (refresh.py skips both).
NOT_PINNED = {"alight", "pip"}


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """Name -> version of each `name==version` line; ValueError naming the first line that is not one."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = PIN.fullmatch(line)
        if found is None:
            raise ValueError(f"line {number} is not `name==version`: {raw!r}")
        name, version = normalize(found[1]), found[2]
        try:
            Version(version)
        except InvalidVersion:
            raise ValueError(f"line {number} has no valid version: {raw!r}") from None
        if name in pins:
            raise ValueError(f"line {number} pins {name} a second time: {raw!r}")
        pins[name] = version
    return pins


def unpinned(installed: dict[str, str], pins: dict[str, str]) -> list[str]:
    """What in `installed` (name -> version) the pins miss or pin at another version."""
    wrong = []
    for name, version in sorted(installed.items()):
        if name in NOT_PINNED:
            continue
        pin = pins.get(name)
        if pin is None:
            wrong.append(f"{name} {version} is not pinned")
        # pip's `==` ignores a local label: 2.13.0 pins the 2.13.0+cpu build.
        elif not Specifier(f"=={pin}").contains(version, prereleases=True):
            wrong.append(f"{name} {version} is pinned at {pin}")
    return wrong


def pip_installed() -> dict[str, str]:
    """name -> version of the distributions pip installed into this environment's site-packages.

    Not every distribution on `sys.path`: `import ray` puts Ray's vendored copies (colorama,
    psutil in `ray/thirdparty_files`) on it, which pip neither installed nor pins."""
    roots = {Path(p).resolve() for p in site.getsitepackages()}
    return {
        normalize(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if Path(str(d.locate_file(""))).resolve() in roots
    }


def test_every_installed_package_is_pinned_at_its_installed_version() -> None:
    installed = pip_installed()
    assert "torch" in installed
    wrong = unpinned(installed, read_pins(CONSTRAINTS.read_text()))
    assert not wrong, f"{CONSTRAINTS.name} does not match this environment ({REFRESH} rewrites it): " + "; ".join(wrong)


def test_the_constraints_file_is_well_formed_and_pins_the_cpu_torch() -> None:
    pins = read_pins(CONSTRAINTS.read_text())
    assert pins["torch"] == "2.13.0"
    assert {"litellm", "transformers", "tensorboard", "wandb", "pytest"} <= pins.keys()
    assert not NOT_PINNED & pins.keys()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("torch>=2.4\n", "line 1 is not `name==version`"),
        ("# pins\n\ntorch\n", "line 3 is not `name==version`"),
        ("rich==13.7 ; python_version < '3.12'\n", "line 1 is not `name==version`"),
        ("-e .\n", "line 1 is not `name==version`"),
        ("rich==13.7 # why\n", "line 1 is not `name==version`"),
        ("rich==latest\n", "line 1 has no valid version"),
        ("Rich==13.7\nrich==13.8\n", "line 2 pins rich a second time"),
    ],
)
def test_a_malformed_line_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read_pins(text)


def test_a_missing_or_different_pin_is_reported() -> None:
    pins = read_pins("torch==2.13.0\nrich==13.7.1\nTyping_Extensions==4.12.0\n")
    installed = {"torch": "2.13.0+cpu", "rich": "13.7.0", "typing-extensions": "4.12.0", "httpx": "0.28.1", "pip": "24"}
    assert unpinned(installed, pins) == ["httpx 0.28.1 is not pinned", "rich 13.7.0 is pinned at 13.7.1"]


# CrewAI has its own CI environment (README's test command, second venv): CrewAI pins pydantic<2.13 and
# mcp<2, and with mcp<2 the main path's LiteLLM fails every request with tools. constraints/crewai.txt pins it.
CREWAI_CONSTRAINTS = CONSTRAINTS.with_name("crewai.txt")


def test_the_crewai_constraints_pin_the_cpu_torch_and_a_litellm_that_works_with_crewai() -> None:
    pins = read_pins(CREWAI_CONSTRAINTS.read_text())
    assert pins["torch"] == "2.13.0" and "crewai" in pins and "pytest" in pins
    assert Version(pins["litellm"]) < Version("1.106.1")  # 1.106.1+ imports mcp 2's types for any tool request
    assert Version(pins["mcp"]) < Version("2")  # what CrewAI requires
    assert not NOT_PINNED & pins.keys()


@pytest.mark.crewai
def test_the_crewai_environment_is_pinned_at_its_installed_versions() -> None:
    pytest.importorskip("crewai", reason='CrewAI is not installed (its own venv: pip install "alight[crewai]")')
    wrong = unpinned(pip_installed(), read_pins(CREWAI_CONSTRAINTS.read_text()))
    assert not wrong, f"{CREWAI_CONSTRAINTS.name} does not match this environment: " + "; ".join(wrong)
