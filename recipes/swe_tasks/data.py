"""SWE-style tasks for coding agents: the shipped set, and a loader that also reads SWE-bench rows.

Layout (SWE-bench's field names; one folder per task, `tasks/<instance_id>/`):

    repo/       the tiny repository: the agent's working copy (agent.sandbox.workdir: repo)
    tests/      the hidden tests, copied into the working copy only after the agent ends
                (reward.tests.files: tests), as the working copy's folder `tests/`
    fix.patch   the reference fix (a unified diff against repo/, `patch -p1`); never shown to agents

`tasks.jsonl` holds one row per task: `instance_id`, `repo` (the repository directory, relative to
the alight checkout), `problem_statement` (the issue as a user filed it), `FAIL_TO_PASS` and
`PASS_TO_PASS` (pytest node ids, relative to the working copy), `tests` (the hidden tests'
directory) and `split` (train or val). `make_tasks` is the config's generator: it returns the rows
of one split with `repo` and `tests` made absolute.

A real SWE-bench file (`tasks_file: /path/swe-bench.jsonl`) names GitHub repositories, not
directories, and keeps FAIL_TO_PASS/PASS_TO_PASS as JSON strings: the loader decodes those, finds
each task's checkout at `repos_dir/<instance_id>` (or `repo` itself when it is a directory), its
hidden tests at `tests` or `tests_dir/<instance_id>`, and skips (with a warning) the rows it has no
checkout for. Rows without `split` belong to every split.

Config: `data.train: recipes/swe_tasks/data.py:make_tasks` (`data.generator_kwargs: {tasks_file: ...,
repos_dir: ..., tests_dir: ...}`).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]  # holds recipes/ (a checkout, the wheel, an init copy): the rows are relative to it
TASKS_FILE = HERE / "tasks.jsonl"
SPLITS = ("train", "val")
NODE_ID_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def make_tasks(
    split: str = "train",
    n: int | None = None,
    seed: int = 0,
    tasks_file: str | None = None,
    repos_dir: str | None = None,
    tests_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Task rows of `split`, shuffled by `seed`, at most `n`: from `tasks_file` (a SWE-bench-style
    jsonl), else the shipped set. ConfigError when the file is missing or no row is usable."""
    if split not in SPLITS:
        raise ConfigError(f"swe_tasks split must be one of {SPLITS}, got {split!r}")
    rows = load_tasks(tasks_file or TASKS_FILE, repos_dir=repos_dir, tests_dir=tests_dir)
    rows = [row for row in rows if row.get("split", split) == split]
    if not rows:
        raise ConfigError(f"swe_tasks: no usable task of split {split!r} in {tasks_file or TASKS_FILE}")
    random.Random(f"{seed}:{split}").shuffle(rows)
    return rows[:n] if n is not None else rows


def load_tasks(
    path: str | Path, *, repos_dir: str | Path | None = None, tests_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Every usable row of the jsonl at `path`, with `repo` and `tests` absolute directories and the
    node-id fields as lists. Relative paths resolve against the file's folder, then the alight
    checkout (the shipped rows), then `repos_dir`/`tests_dir` by instance id."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"swe_tasks: no task file {path}")
    bases = [path.resolve().parent, CHECKOUT]
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"swe_tasks: {path}:{number} is not JSON ({exc.msg})") from None
        row = _usable_row(raw, bases, repos_dir, tests_dir, where=f"{path}:{number}")
        if row is not None:
            rows.append(row)
    return rows


def _usable_row(
    raw: Mapping[str, Any], bases: list[Path], repos_dir: str | Path | None, tests_dir: str | Path | None, where: str
) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping) or not raw.get("instance_id") or not raw.get("problem_statement"):
        raise ConfigError(f"swe_tasks: {where} needs an instance_id and a problem_statement")
    row = dict(raw)
    instance = str(row["instance_id"])
    repo = _directory(row.get("repo"), bases, repos_dir, instance)
    if repo is None:
        logger.warning("swe_tasks: %s: no checkout of %s (%r); skipped", where, instance, row.get("repo"))
        return None
    row["repo"] = str(repo)
    tests = _directory(row.get("tests"), bases, tests_dir, instance)
    row["tests"] = str(tests) if tests is not None else None
    for key in NODE_ID_FIELDS:
        row[key] = _node_ids(row.get(key), key, where)
    return row


def _directory(value: Any, bases: list[Path], root: str | Path | None, instance: str) -> Path | None:
    candidates = [Path(root).expanduser() / instance] if root is not None else []
    if isinstance(value, str) and value:
        given = Path(value).expanduser()
        candidates[:0] = [given] if given.is_absolute() else [base / given for base in bases]
    return next((c.resolve() for c in candidates if c.is_dir()), None)


def _node_ids(value: Any, key: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # SWE-bench keeps these lists as JSON strings
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"swe_tasks: {where}: {key} is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"swe_tasks: {where}: {key} must be a list of pytest node ids")
    return list(value)


def working_copy(task: Mapping[str, Any], dest: str | Path, *, fixed: bool = False, hidden_tests: bool = False) -> Path:
    """Copy the task's repository to `dest` (a new directory), as the sandbox does for an attempt;
    `fixed` applies the reference fix (`fix.patch` beside `repo/`, with `patch`), `hidden_tests`
    then copies the hidden tests in, as the tests reward does after the agent."""
    dest = Path(dest)
    shutil.copytree(task["repo"], dest)
    if fixed:
        apply_patch(Path(task["repo"]).parent / "fix.patch", dest)
    if hidden_tests and task.get("tests"):  # under their own folder name, as alight.rewards.tests copies them
        shutil.copytree(task["tests"], dest / Path(task["tests"]).name, dirs_exist_ok=True)
    return dest


def apply_patch(patch: Path, workdir: Path) -> None:
    """Apply the unified diff `patch` (paths a/..., b/...) to the files under `workdir`."""
    tool = shutil.which("patch")
    if tool is None or not patch.is_file():
        raise ConfigError(f"swe_tasks: cannot apply {patch}: " + ("no such file" if tool else "no `patch` program"))
    done = subprocess.run(
        [tool, "-p1", "--batch", "--forward", "-i", str(patch)], cwd=workdir, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ConfigError(f"swe_tasks: {patch} does not apply: {done.stdout.strip().splitlines()[-1:]}")
