"""The docs site builds with `mkdocs build --strict` with no network, and a broken link fails it.

Both builds run at once (each ~10 s on 2 cores, most of it rendering the API reference)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Loaded first by each build's interpreter (PYTHONPATH): any connection beyond loopback fails loudly.
NO_NETWORK = """
import socket

_connect = socket.socket.connect


def _loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if self.family == socket.AF_UNIX or host in ("127.0.0.1", "::1", "localhost"):
        return _connect(self, address)
    raise OSError(f"the docs build tried to reach {address}: it must build offline")


socket.socket.connect = _loopback_only
"""


def _start_build(config: Path, site: Path, guard: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(guard), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_the_site_builds_strict_offline_and_a_broken_link_fails_it(tmp_path: Path) -> None:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    # A copy of the docs whose home page links to a page that does not exist.
    broken = tmp_path / "broken"
    shutil.copytree(ROOT / "docs", broken / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", broken / "mkdocs.yml")
    (broken / "src").symlink_to(ROOT / "src")
    with (broken / "docs" / "index.md").open("a") as page:
        page.write("\nSee [the missing page](missing.md).\n")

    good = _start_build(ROOT / "mkdocs.yml", tmp_path / "site", guard)
    bad = _start_build(broken / "mkdocs.yml", tmp_path / "broken-site", guard)
    good_log, _ = good.communicate(timeout=240)
    bad_log, _ = bad.communicate(timeout=240)

    assert good.returncode == 0, good_log
    assert "WARNING" not in good_log, good_log
    assert bad.returncode != 0, bad_log
    assert "missing.md" in bad_log, bad_log

    site = tmp_path / "site"
    config_page = (site / "reference" / "config" / "index.html").read_text()
    assert 'id="engine.sampling.max_tokens"' in config_page and 'id="algorithm.apo.optimizer"' in config_page
    assert 'id="alight-train"' in (site / "reference" / "cli" / "index.html").read_text()
    api_page = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="alight.Trainer"' in api_page and 'id="alight.trainer.trainer.Trainer.fit"' in api_page
    assert not any("<!-- generated:" in p.read_text() for p in (site / "reference").rglob("*.html"))
    assert not list(site.rglob("*.py"))  # the hooks and the generator are not pages
