"""Task data from jsonl/csv/parquet files, saved datasets and generator functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alight.data import load_rows, sample_rows, task_input
from alight.errors import ConfigError

ROWS = [{"question": f"q{i}", "answer": i} for i in range(5)]


def test_jsonl_csv_parquet_and_saved_dataset_give_the_same_rows(tmp_path: Path) -> None:
    import datasets

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_csv(str(tmp_path / "d.csv"), index=False)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for spec in ("d.jsonl", "d.csv", "d.parquet", "saved"):
        assert load_rows(spec, base_dir=tmp_path) == ROWS, spec
    assert load_rows(str(tmp_path / "d.jsonl"), size=2) == ROWS[:2]


def test_generator_gets_n_seed_and_kwargs(tmp_path: Path) -> None:
    (tmp_path / "gen.py").write_text(
        "def make(n, seed, scale=1):\n    return [{'x': i * scale, 'seed': seed} for i in range(n)]\n"
    )
    rows = load_rows(f"{tmp_path / 'gen.py'}:make", size=3, seed=7, generator_kwargs={"scale": 10})
    assert rows == [{"x": 0, "seed": 7}, {"x": 10, "seed": 7}, {"x": 20, "seed": 7}]


@pytest.mark.parametrize("spec", ["missing.jsonl", "no_such_module:make", "data.txt"])
def test_bad_data_specs_are_one_line_config_errors(tmp_path: Path, spec: str) -> None:
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ConfigError) as raised:
        load_rows(spec, base_dir=tmp_path)
    assert "\n" not in str(raised.value)


def test_sampling_is_seeded_and_covers_rows() -> None:
    assert sample_rows(ROWS, 5, seed=1) == sample_rows(ROWS, 5, seed=1)
    assert sorted(r["answer"] for r in sample_rows(ROWS, 5, seed=1)) == [0, 1, 2, 3, 4]
    assert len(sample_rows(ROWS, 12, seed=1)) == 12


def test_task_input_picks_a_column_or_the_row() -> None:
    assert task_input(ROWS[0], None) == ROWS[0]
    assert task_input(ROWS[0], "question") == "q0"
    with pytest.raises(ConfigError, match="no column"):
        task_input(ROWS[0], "prompt")
