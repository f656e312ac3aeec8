"""Relative paths in a config are read against the config file's folder; those given on the command
line against the current folder; a missing one is one line naming the path and that folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.config import load_config
from alight.errors import ConfigError


def experiment(folder: Path, body: str) -> Path:
    """`folder/exp.yaml` with `body`, beside a recipe folder `recipes/mine/` holding an agent, a
    data file, a script, a chat template and a model directory."""
    recipe = folder / "recipes" / "mine"
    (recipe / "model").mkdir(parents=True)
    (recipe / "agent.py").write_text("def solve(task, llm):\n    return 1.0\n")
    (recipe / "data.py").write_text("def rows(n=2):\n    return [{'q': i} for i in range(n)]\n")
    (recipe / "rows.jsonl").write_text('{"q": 1}\n')
    (recipe / "run.sh").write_text("#!/bin/sh\necho 1\n")
    (recipe / "run.sh").chmod(0o755)
    (recipe / "template.jinja").write_text("{{ messages }}")
    config = folder / "exp.yaml"
    config.write_text(body)
    return config


INPUTS = """\
name: mine
agent:
  entrypoint: recipes/mine/agent.py:solve
data:
  train: recipes/mine/rows.jsonl
  val: recipes/mine/data.py:rows
warm_start:
  data: recipes/mine/data.py:rows
engine:
  model: recipes/mine/model
  chat_template: recipes/mine/template.jinja
"""


def test_paths_written_in_a_config_are_read_against_its_folder_from_any_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = experiment(tmp_path / "project", INPUTS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(config)
    recipe = (tmp_path / "project" / "recipes" / "mine").resolve()
    assert cfg.agent.entrypoint == f"{recipe / 'agent.py'}:solve"
    assert cfg.data.train == str(recipe / "rows.jsonl")
    assert cfg.data.val == cfg.warm_start.data == f"{recipe / 'data.py'}:rows"
    assert cfg.engine.model == str(recipe / "model")
    assert cfg.engine.chat_template == str(recipe / "template.jinja")
    assert cfg.trainer.output_dir == "runs"  # an output: where the user runs, not where the config is


def test_names_modules_and_absolute_paths_are_left_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = experiment(tmp_path / "other", "name: x\nagent:\n  entrypoint: os:getcwd\n").parent / "recipes"
    config = experiment(
        tmp_path / "project",
        f"name: x\nagent:\n  entrypoint: json:dumps\ndata:\n  train: {absolute}/mine/rows.jsonl\n"
        "engine:\n  model: tiny\n  chat_template: chatml-tools\n",
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(config)
    assert cfg.agent.entrypoint == "json:dumps"
    assert cfg.data.train == f"{absolute}/mine/rows.jsonl"
    assert (cfg.engine.model, cfg.engine.chat_template) == ("tiny", "chatml-tools")


def test_a_command_agent_script_and_exposed_folders_are_read_against_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = experiment(
        tmp_path / "project",
        "name: x\nagent:\n  command: sh recipes/mine/run.sh --flag 4\n  sandbox:\n    expose: [recipes/mine]\n",
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(config)
    recipe = (tmp_path / "project" / "recipes" / "mine").resolve()
    assert list(cfg.agent.command) == ["sh", str(recipe / "run.sh"), "--flag", "4"]  # `sh` is a program on PATH
    assert list(cfg.agent.sandbox.expose) == [str(recipe)]
    direct = experiment(tmp_path / "p2", "name: x\nagent:\n  command: [recipes/mine/run.sh]\n")
    assert list(load_config(direct).agent.command) == [str((tmp_path / "p2/recipes/mine/run.sh").resolve())]


def test_overrides_on_the_command_line_are_read_against_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = experiment(tmp_path / "project", INPUTS)
    here = tmp_path / "here"
    (here / "data").mkdir(parents=True)
    (here / "data" / "mine.jsonl").write_text('{"q": 2}\n')
    monkeypatch.chdir(here)
    cfg = load_config(config, ["data.train=data/mine.jsonl"])
    assert cfg.data.train == str((here / "data" / "mine.jsonl").resolve())
    assert cfg.data.val.startswith(str((tmp_path / "project").resolve()))  # the file's own: still its folder


@pytest.mark.parametrize(
    ("body", "overrides", "key", "path"),
    [
        ("name: x\nagent:\n  entrypoint: recipes/gone.py:solve\n", [], "agent.entrypoint", "recipes/gone.py"),
        (INPUTS.replace("rows.jsonl", "none.jsonl"), [], "data.train", "recipes/mine/none.jsonl"),
        (INPUTS, ["engine.chat_template=nope.jinja"], "engine.chat_template", "nope.jinja"),
        ("name: x\nagent:\n  command: [bin/agent]\n", [], "agent.command", "bin/agent"),
        ("name: x\nagent:\n  command: [sh]\n  sandbox:\n    expose: [gone]\n", [], "agent.sandbox.expose", "gone"),
    ],
    ids=["entrypoint", "data-file", "override", "command", "expose"],
)
def test_a_missing_path_is_one_line_naming_the_path_and_the_folder_it_was_read_against(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, overrides: list[str], key: str, path: str
) -> None:
    config = experiment(tmp_path / "project", body)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(ConfigError) as err:
        load_config(config, overrides)
    message = str(err.value)
    folder = here if overrides else (tmp_path / "project").resolve()
    assert "\n" not in message and f"{key}: no such file or folder {path} (read against {folder};" in message
    assert "read against its folder" in message  # the rule, in the message
