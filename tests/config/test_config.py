"""Experiment configs: YAML over the Hydra schema, overrides, one-line errors for bad keys and types."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.config import ExperimentConfig, load_config, to_object, to_yaml
from alight.errors import ConfigError


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\nagent:\n  entrypoint: pkg.agent:solve\nrunner:\n  n_runners: 2\n")
    return path


def test_yaml_fills_the_schema_and_defaults_fill_the_rest(experiment: Path) -> None:
    cfg = to_object(load_config(experiment))
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.agent.entrypoint == "pkg.agent:solve"
    assert cfg.runner.n_runners == 2
    assert cfg.runner.max_attempts == 2  # schema default
    assert cfg.engine.kind == "embedded"


def test_overrides_apply_in_hydra_syntax(experiment: Path) -> None:
    cfg = to_object(
        load_config(experiment, ["runner.n_runners=8", "engine.sampling.temperature=0.5", "+data.generator_kwargs.k=3"])
    )
    assert cfg.runner.n_runners == 8
    assert cfg.engine.sampling.temperature == 0.5
    assert cfg.data.generator_kwargs == {"k": 3}


def test_resolved_config_prints_as_yaml(experiment: Path) -> None:
    text = to_yaml(load_config(experiment))
    assert "entrypoint: pkg.agent:solve" in text and "n_runners: 2" in text


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "names"),
    [
        ("agent:\n  entrypoint: a:b\nrunner:\n  nrunners: 2\n", [], "nrunners"),
        ("agent:\n  entrypoint: a:b\nrunner:\n  n_runners: many\n", [], "many"),
        ("agent:\n  entrypoint: a:b\n", ["runner.n_runners=abc"], "abc"),
        ("agent:\n  entrypoint: a:b\n", ["runner.nrunners=3"], "nrunners"),
        ("agent:\n  entrypoint: a:b\n", ["+runner.bogus=3"], "runner.bogus"),
        ("agent:\n  entrypoint: a:b\n", ["+bogus=1"], "bogus"),
        ("runner:\n  n_runners: 3\n", [], "agent.entrypoint"),
        ("agent: [\n", [], "exp"),
    ],
)
def test_bad_keys_and_types_fail_in_one_line_naming_them(
    tmp_path: Path, yaml_text: str, overrides: list[str], names: str
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, overrides)
    message = str(raised.value)
    assert names in message
    assert "\n" not in message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
