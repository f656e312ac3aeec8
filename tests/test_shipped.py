"""The shipped experiments: configs by name from any folder, `alight recipes`, `alight init`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alight.config import load_config
from alight.errors import ConfigError
from alight.shipped import find_config, init_recipe, referenced_folders, shipped_configs, shipped_root, summary
from tests.cli.in_process import alight_here

REPO = Path(__file__).resolve().parents[1]


def test_a_checkout_ships_its_configs_recipes_and_examples() -> None:
    assert shipped_root() == REPO
    configs = shipped_configs()
    assert configs == {p.stem: p for p in sorted((REPO / "configs").glob("*.yaml"))}
    assert "calc" in configs and "spider" in configs


def test_a_config_is_found_by_name_or_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_config("calc") == REPO / "configs" / "calc.yaml"
    assert find_config("configs/calc.yaml") == Path("configs/calc.yaml")  # a path: as it is, even if missing
    (tmp_path / "calc").write_text("name: mine\n")  # a file of that name here wins over the shipped one
    assert find_config("calc") == Path("calc")
    with pytest.raises(ConfigError, match=r"no shipped experiment named 'calcc'; did you mean calc\b"):
        find_config("calcc")


def test_the_summary_is_the_first_sentence_of_the_opening_comment(tmp_path: Path) -> None:
    config = tmp_path / "x.yaml"
    config.write_text("# Trains a thing (recipes/x/): on a CPU. More here\n# and here.\n#   alight train x\nname: x\n")
    assert summary(config) == "Trains a thing (recipes/x/): on a CPU"
    config.write_text("# A long line that goes\n# on to a second line\n#   alight train x\n")
    assert summary(config) == "A long line that goes on to a second line"
    assert summary(config, width=12) == "A long li..."
    config.write_text("name: x\n")
    assert summary(config) == ""


def test_init_copies_a_config_and_every_folder_it_names_transitively(tmp_path: Path) -> None:
    # calc_autogen's agent loads calc's; the Codex recipe imports the shared SWE driver
    assert referenced_folders(REPO / "configs" / "calc_autogen.yaml", REPO) == ["recipes/calc_autogen", "recipes/calc"]
    codex = referenced_folders(REPO / "configs" / "codex_cli.yaml", REPO)
    assert {"recipes/codex_cli", "recipes/swe_harness", "recipes/swe_tasks"} <= set(codex)
    assert referenced_folders(REPO / "configs" / "calc_node.yaml", REPO)[0] == "examples/node_agent"
    copied = init_recipe("calc_autogen", tmp_path / "mine")
    assert copied.config == tmp_path / "mine" / "calc_autogen.yaml"
    assert "../recipes/" not in copied.config.read_text() and "entrypoint: recipes/calc_autogen/agent.py" in (
        copied.config.read_text()
    )
    assert (tmp_path / "mine/recipes/calc/agent.py").is_file() and (
        tmp_path / "mine/recipes/calc_autogen/data.py"
    ).is_file()
    assert not list((tmp_path / "mine").rglob("__pycache__"))


def test_init_does_not_overwrite_unless_forced(tmp_path: Path) -> None:
    init_recipe("quickstart", tmp_path)
    (tmp_path / "quickstart.yaml").write_text("# edited\n")
    with pytest.raises(ConfigError, match=r"quickstart\.yaml exists: pick an empty folder, or --force"):
        init_recipe("quickstart", tmp_path)
    assert (tmp_path / "quickstart.yaml").read_text() == "# edited\n"  # nothing lost
    init_recipe("quickstart", tmp_path, force=True)
    assert "entrypoint: recipes/quickstart/agent.py" in (tmp_path / "quickstart.yaml").read_text()


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_every_shipped_experiment_copied_by_init_loads_from_another_folder(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied = init_recipe(name, tmp_path / "copy")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = load_config(copied.config)  # every path it names is there, read against the copy's folder
    named = [cfg.agent.entrypoint or "", *map(str, cfg.agent.command or []), cfg.data.train or "", cfg.data.val or ""]
    assert not [value for value in named if value.startswith(str(REPO))], name  # none of the checkout's files
    assert any(value.startswith(str(tmp_path / "copy")) for value in named), (name, named)  # the copy's


def test_alight_recipes_lists_each_experiment_on_one_line(tmp_path: Path) -> None:
    done = alight_here("recipes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name, path in shipped_configs().items():
        assert any(line.split()[:1] == [name] and summary(path)[:40] in line for line in lines), name
    as_json = alight_here("recipes", "--json", cwd=tmp_path)
    report = json.loads(as_json.stdout)
    assert [row["name"] for row in report["experiments"]] == list(shipped_configs())


def test_alight_init_writes_a_copy_and_refuses_to_overwrite_it(tmp_path: Path) -> None:
    done = alight_here("init", "calc", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calc" / "calc.yaml").is_file() and (tmp_path / "calc/recipes/calc/agent.py").is_file()
    assert "alight train calc/calc.yaml" in done.stdout
    again = alight_here("init", "calc", cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "exists" in again.stderr
    unknown = alight_here("init", "nope", str(tmp_path / "x"), cwd=tmp_path)
    assert unknown.returncode == 2 and "no shipped experiment named 'nope'" in unknown.stderr
    assert not (tmp_path / "x").exists()
