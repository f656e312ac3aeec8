"""The docs' pictures: well-formed SVGs that load nothing from the network and show what the pages say they show."""

from __future__ import annotations

import importlib.util
import io
import re
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from tests.docs.examples import ROOT

IMAGES = ROOT / "docs" / "images"
#: A reference that leaves the page: a URL in `url(...)`, `href` or `src` (the xmlns namespaces are no load).
REMOTE = re.compile(r"""(?:url\(\s*["']?|href\s*=\s*["']|src\s*=\s*["'])(?:https?:)?//""", re.IGNORECASE)
LOOP_WORDS = ("your agent", "LLM proxy", "engine", "store", "adapter", "LightningRL", "trainer", "GRPO / PPO")


@pytest.mark.parametrize("name", ["loop.svg", "dashboard.svg"])
def test_the_svgs_are_well_formed_and_offline(name: str) -> None:
    text = (IMAGES / name).read_text(encoding="utf-8")
    assert ET.fromstring(text).tag.endswith("svg")
    found = REMOTE.search(text)
    assert found is None, f"{name} loads {text[found.start() : found.start() + 80]!r} from the network"


def test_the_loop_diagram_names_each_part_and_arrow() -> None:
    text = " ".join(ET.parse(IMAGES / "loop.svg").getroot().itertext())
    for word in (*LOOP_WORDS, "spans", "transitions", "new weights"):
        assert word in text, f"loop.svg never says {word!r}"


def test_the_dashboard_is_a_finished_run_of_calc() -> None:
    text = (IMAGES / "dashboard.svg").read_text(encoding="utf-8").replace("&#160;", " ")
    for shown in ("alight train calc.yaml", "reward", "rollouts", "step time", "throughput", "actor"):
        assert shown in text, f"dashboard.svg never shows {shown!r}"
    assert re.search(r"done \d+ steps · val reward", text), "dashboard.svg is not the last frame of a finished run"


def test_the_capture_drops_richs_web_fonts() -> None:
    spec = importlib.util.spec_from_file_location("capture_dashboard", ROOT / "docs" / "capture_dashboard.py")
    assert spec is not None and spec.loader is not None
    capture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capture)
    console = Console(record=True, width=40, file=io.StringIO())
    console.print("[bold]step 1/1[/bold]")
    svg = console.export_svg()
    assert REMOTE.search(svg) is not None  # Rich links its fonts on a CDN
    cleaned = capture.offline(svg)
    assert REMOTE.search(cleaned) is None
    assert 'src: local("FiraCode-Regular");' in cleaned
    ET.fromstring(cleaned)
