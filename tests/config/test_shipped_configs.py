"""Every experiment in configs/ loads, names an agent that imports, and has data."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.agent import LitAgent, load_agent
from alight.config import load_config, to_object
from alight.trainer.dev import dev_rows
from alight.trainer.stack import runner_agent

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_loads_with_its_agent_and_data(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # configs name paths from the repository root, as the README runs them
    cfg = to_object(load_config(path))
    agent = runner_agent(cfg.agent)  # an entrypoint, or a command agent (any language)
    assert (agent if isinstance(agent, LitAgent) else load_agent(agent)).name
    assert len(dev_rows(cfg, 2)) == 2


def test_there_is_a_shipped_config() -> None:
    assert CONFIGS
