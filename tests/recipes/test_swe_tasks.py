"""The SWE-style task set (recipes/swe_tasks/): every task's hidden tests fail on the shipped
repository and pass on the reference fix, run by real pytest in a fresh working copy laid out as
the sandbox and the tests reward lay it out; and the loader, on the shipped set and on rows in a
real SWE-bench file's form."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from alight.data import load_rows
from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "recipes" / "swe_tasks" / "data.py"
make_tasks = resolve_entrypoint(f"{DATA}:make_tasks")  # loaded as alight loads a generator
load_tasks = resolve_entrypoint(f"{DATA}:load_tasks")
working_copy = resolve_entrypoint(f"{DATA}:working_copy")

ALL = make_tasks("train") + make_tasks("val")
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) (\S+)", re.MULTILINE)


def outcomes(workdir: Path) -> dict[str, str]:
    """Node id -> PASSED/FAILED/ERROR of every test pytest runs in `workdir` (its -rA summary)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the task's tests need no plugin; the venv's would only slow it
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {node: status for status, node in _OUTCOME.findall(done.stdout)}


def test_the_shipped_set_in_swe_bench_fields() -> None:
    rows = [json.loads(line) for line in (REPO / "recipes/swe_tasks/tasks.jsonl").read_text().splitlines()]
    assert 6 <= len(rows) <= 8 and len({r["instance_id"] for r in rows}) == len(rows)
    for row in rows:
        assert {"instance_id", "repo", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS", "tests"} <= set(row)
        folder = REPO / "recipes/swe_tasks/tasks" / row["instance_id"]
        assert row["repo"] == f"recipes/swe_tasks/tasks/{row['instance_id']}/repo" and (folder / "repo").is_dir()
        assert (REPO / row["tests"]).is_dir() and (folder / "fix.patch").is_file()
        assert not any(p.name.startswith("test_") for p in (folder / "repo").rglob("*.py")), "tests stay hidden"
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]
    train, val = make_tasks("train"), make_tasks("val")
    assert len(train) >= 5 and len(val) >= 2
    assert not {r["instance_id"] for r in train} & {r["instance_id"] for r in val}
    for row in train + val:
        assert Path(row["repo"]).is_absolute() and Path(row["repo"]).is_dir()
        assert Path(row["tests"]).is_absolute() and Path(row["tests"]).is_dir()


@pytest.mark.parametrize("task", ALL, ids=[t["instance_id"] for t in ALL])
def test_hidden_tests_fail_before_the_fix_and_pass_after(task: dict[str, Any], tmp_path: Path) -> None:
    before = outcomes(working_copy(task, tmp_path / "before", hidden_tests=True))
    assert set(before) == set(task["FAIL_TO_PASS"]) | set(task["PASS_TO_PASS"]), "node ids match the tests run"
    assert {node: before[node] for node in task["FAIL_TO_PASS"]} == dict.fromkeys(task["FAIL_TO_PASS"], "FAILED")
    assert {node: before[node] for node in task["PASS_TO_PASS"]} == dict.fromkeys(task["PASS_TO_PASS"], "PASSED")
    after = outcomes(working_copy(task, tmp_path / "after", fixed=True, hidden_tests=True))
    assert after == dict.fromkeys(before, "PASSED")


def test_the_reference_fix_is_one_small_edit() -> None:
    for task in ALL:
        diff = (Path(task["repo"]).parent / "fix.patch").read_text().splitlines()
        edits = [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        assert 0 < len(edits) <= 6 and sum(d.startswith("+++") for d in diff) == 1, task["instance_id"]
        assert 20 <= sum(len(f.read_text().splitlines()) for f in Path(task["repo"]).rglob("*.py")) <= 80


def test_make_tasks_through_alight_data_loading() -> None:
    spec = f"{DATA}:make_tasks"
    train = load_rows(spec, size=3, seed=1, split="train")
    assert len(train) == 3 and all(r["split"] == "train" for r in train)
    assert load_rows(spec, seed=1, split="train") != load_rows(spec, seed=2, split="train")  # seeded order
    assert {r["instance_id"] for r in load_rows(spec, split="val")} == {r["instance_id"] for r in make_tasks("val")}
    with pytest.raises(ConfigError, match="split"):
        make_tasks("test")


def test_a_swe_bench_style_file(tmp_path: Path) -> None:
    """Rows as SWE-bench ships them: `repo` a GitHub name, node ids as JSON strings, no split."""
    (tmp_path / "checkouts" / "astropy__astropy-12907").mkdir(parents=True)
    (tmp_path / "hidden" / "astropy__astropy-12907").mkdir(parents=True)
    common = {
        "repo": "astropy/astropy",
        "problem_statement": "Modeling's separability_matrix ...",
        "base_commit": "d16",
    }
    rows = [
        {**common, "instance_id": "astropy__astropy-12907", "FAIL_TO_PASS": '["a.py::t1"]', "PASS_TO_PASS": "[]"},
        {**common, "instance_id": "astropy__astropy-99999", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"},
    ]
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kwargs = {"tasks_file": str(path), "repos_dir": str(tmp_path / "checkouts"), "tests_dir": str(tmp_path / "hidden")}
    for split in ("train", "val"):
        (row,) = make_tasks(split, **kwargs)  # no split field: in every split; the row without a checkout is skipped
        assert row["repo"] == str(tmp_path / "checkouts" / "astropy__astropy-12907")
        assert row["tests"] == str(tmp_path / "hidden" / "astropy__astropy-12907")
        assert row["FAIL_TO_PASS"] == ["a.py::t1"] and row["PASS_TO_PASS"] == [] and row["base_commit"] == "d16"
    with pytest.raises(ConfigError, match="no usable task"):
        make_tasks("train", tasks_file=str(path))  # no checkouts anywhere


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"instance_id": "x"}', "problem_statement"),
        ('{"instance_id": "x", "problem_statement": "p", "repo": ".", "FAIL_TO_PASS": "[1"}', "FAIL_TO_PASS"),
        ('{"instance_id": "x", "problem_statement": "p", "repo": ".", "PASS_TO_PASS": [1]}', "PASS_TO_PASS"),
    ],
)
def test_bad_task_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=message):
        load_tasks(path)
    with pytest.raises(ConfigError, match="no task file"):
        load_tasks(tmp_path / "missing.jsonl")


def test_a_patch_that_does_not_apply_is_a_config_error(tmp_path: Path) -> None:
    task = ALL[0]
    fixed = working_copy(task, tmp_path / "w", fixed=True)
    with pytest.raises(ConfigError, match="does not apply"):
        resolve_entrypoint(f"{DATA}:apply_patch")(Path(task["repo"]).parent / "fix.patch", fixed)  # applied twice
