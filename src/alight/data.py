"""Task data: rows from files or saved datasets (loaded with Hugging Face `datasets`) or from a generator."""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError, one_line

logger = logging.getLogger(__name__)

_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(
    spec: str,
    *,
    size: int | None = None,
    seed: int = 0,
    generator_kwargs: Mapping[str, Any] | None = None,
    base_dir: str | Path | None = None,
    split: str | None = None,
) -> list[dict[str, Any]]:
    """Rows named by `spec`: a .jsonl/.json/.parquet/.csv file, a directory written by
    `Dataset.save_to_disk`, or a generator `module:function` / `file.py:function`.

    A generator is called with `generator_kwargs` and those it accepts among `n` (= `size`), `seed`
    and `split` ("train" or "val": the split the caller wants). Relative paths resolve against
    `base_dir` (the config's folder) first, then the working directory. `size` caps the rows."""
    path = _existing_path(spec, base_dir)
    rows = (
        _rows_from_path(path)
        if path is not None
        else _rows_from_generator(spec, size, seed, generator_kwargs or {}, split)
    )
    if size is not None:
        rows = rows[:size]
    if not rows:
        raise ConfigError(f"data {spec!r} holds no rows")
    return rows


def _existing_path(spec: str, base_dir: str | Path | None) -> Path | None:
    candidates = [Path(spec).expanduser()]
    if base_dir is not None and not Path(spec).is_absolute():
        candidates.insert(0, Path(base_dir) / spec)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    looks_like_file = Path(spec).suffix in _FILE_FORMATS or spec.endswith("/")
    if looks_like_file or ":" not in spec:
        raise ConfigError(f"data file {spec} does not exist")
    return None


def _rows_from_path(path: Path) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                raise ConfigError(f"data {path} is a DatasetDict; name one split's directory")
        else:
            fmt = _FILE_FORMATS.get(path.suffix)
            if fmt is None:
                raise ConfigError(f"data file {path}: unknown format (use .jsonl, .json, .parquet, .csv)")
            loaded = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"data {path}: cannot load ({one_line(err)})") from None
    return [dict(row) for row in loaded]


def _rows_from_generator(
    spec: str, size: int | None, seed: int, kwargs: Mapping[str, Any], split: str | None = None
) -> list[dict[str, Any]]:
    fn = resolve_entrypoint(spec, what="data")
    if not callable(fn):
        raise ConfigError(f"data entrypoint {spec!r} is not a function")
    params = inspect.signature(fn).parameters
    call: dict[str, Any] = dict(kwargs)
    if "n" in params and size is not None:
        call["n"] = size
    if "seed" in params:
        call["seed"] = seed
    if "split" in params and split is not None:
        call.setdefault("split", split)
    try:
        produced = fn(**call)
    except TypeError as err:
        raise ConfigError(f"data generator {spec!r}: {one_line(err)}") from None
    if not isinstance(produced, Iterable):
        raise ConfigError(f"data generator {spec!r} returned {type(produced).__name__}, not rows")
    rows = [_as_row(row, spec) for row in produced]
    return rows


def _as_row(row: Any, spec: str) -> dict[str, Any]:
    if isinstance(row, Mapping):
        return dict(row)
    raise ConfigError(f"data generator {spec!r} yielded a {type(row).__name__}; rows must be dicts")


def sample_rows(rows: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """`n` rows in a seeded random order (all rows, repeated if `n` exceeds them)."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    picked: list[dict[str, Any]] = []
    while len(picked) < n:
        rng.shuffle(order)
        picked.extend(rows[i] for i in order[: n - len(picked)])
    return picked


def task_input(row: Mapping[str, Any], input_field: str | None) -> Any:
    """What the agent receives as `task`: one column, or the whole row."""
    if input_field is None:
        return dict(row)
    if input_field not in row:
        raise ConfigError(f"data rows have no column {input_field!r} (data.input_field); columns: {sorted(row)}")
    return row[input_field]
