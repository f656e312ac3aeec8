"""Every experiment in configs/ loads, names an agent that imports, and has data."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.agent import LitAgent, load_agent
from alight.agent_setup import runner_agent
from alight.config import load_config, to_object
from alight.trainer.tasks import dev_rows

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
# Configs whose agent needs a framework with its own environment (README's test command): its module.
OWN_ENVIRONMENT = {"calc_crewai": "crewai"}


def config_param(path: Path) -> object:
    if path.stem in OWN_ENVIRONMENT:
        return pytest.param(path, id=path.stem, marks=getattr(pytest.mark, OWN_ENVIRONMENT[path.stem]))
    return pytest.param(path, id=path.stem)


@pytest.mark.parametrize("path", [config_param(p) for p in CONFIGS])
def test_shipped_config_loads_with_its_agent_and_data(
    path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if path.stem in OWN_ENVIRONMENT:
        module = OWN_ENVIRONMENT[path.stem]
        pytest.importorskip(module, reason=f'{module} is not installed (pip install "alight[{module}]")')
    monkeypatch.chdir(tmp_path)  # a config's paths are read against its folder: any working folder will do
    cfg = to_object(load_config(path.stem))  # by name, as `alight train calc` reads it
    agent = runner_agent(cfg.agent)  # an entrypoint, or a command agent (any language)
    assert (agent if isinstance(agent, LitAgent) else load_agent(agent)).name
    assert len(dev_rows(cfg, 2)) == 2


def test_there_is_a_shipped_config() -> None:
    assert CONFIGS
