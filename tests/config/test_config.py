"""Experiment configs: YAML over the Hydra schema, overrides, one-line errors for bad keys and types
(an unknown key names the keys near it)."""

from __future__ import annotations

import subprocess
import sys
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


ENTRYPOINT = "agent:\n  entrypoint: a:b\n"
LR = "did you mean 'algorithm.lr'?"


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("", ["algorithm.lrr=1e-5"], "override 'algorithm.lrr=1e-5': unknown key 'algorithm.lrr'; " + LR),
        ("", ["+algorithm.lrr=1"], "override '+algorithm.lrr=1': unknown key 'algorithm.lrr'; " + LR),
        ("", ["algorith.lr=1"], "override 'algorith.lr=1': unknown key 'algorith'; did you mean 'algorithm'?"),
        (
            "",
            ["engine.sampling.temprature=0"],
            "override 'engine.sampling.temprature=0': unknown key 'engine.sampling.temprature';"
            " did you mean 'engine.sampling.temperature'?",
        ),
        (
            "",
            ["no_such=1"],
            "override 'no_such=1': unknown key 'no_such'; the top-level keys are: name, agent, reward, data, engine,"
            " proxy, store, runner, dev, adapter, algorithm, warm_start, trainer, logging, verl",
        ),
        (
            "",
            ["algorithm.lora.rnk=3"],
            "override 'algorithm.lora.rnk=3': unknown key 'algorithm.lora.rnk';"
            " algorithm.lora's keys are: enabled, r, alpha, dropout, target_modules, per_agent, agents",
        ),
        ("algorithm:\n  lrr: 1.0e-5\n", [], "unknown key 'algorithm.lrr'; " + LR),
        ("algoritm:\n  lr: 1.0e-5\n", [], "unknown key 'algoritm'; did you mean 'algorithm'?"),
        ("logging:\n  tensorbord: true\n", [], "unknown key 'logging.tensorbord'; did you mean 'logging.tensorboard'?"),
    ],
)
def test_an_unknown_key_names_the_keys_near_it(
    tmp_path: Path, yaml_text: str, overrides: list[str], message: str
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(ENTRYPOINT + yaml_text)
    with pytest.raises(ConfigError) as raised:
        load_config(path, overrides)
    assert str(raised.value) == f"config {path}: {message}"


def test_keys_of_free_form_fields_and_hydra_keys_stay_allowed(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("defaults:\n  - _self_\n" + ENTRYPOINT + "data:\n  generator_kwargs:\n    k: 1\n")
    cfg = to_object(load_config(path, ["+data.generator_kwargs.n=2", "++engine.options.x=1"]))
    assert cfg.data.generator_kwargs == {"k": 1, "n": 2} and cfg.engine.options == {"x": 1}


def test_the_cli_prints_an_unknown_key_in_one_line_and_exits_2() -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "alight", "train", "configs/calc.yaml", "algorithm.lrr=1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: config configs/calc.yaml: override 'algorithm.lrr=1': unknown key 'algorithm.lrr';"
        " did you mean 'algorithm.lr'?"
    ]
    assert done.stdout == ""
