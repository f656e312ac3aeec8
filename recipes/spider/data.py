"""Spider-layout data for the SQL agent: a loader of Spider's files, and a small set written for alight.

Spider (Yu et al., 2018) ships `tables.json` (each database's tables, columns, keys), question
files (`train_spider.json`, `dev.json`, `test.json`: records with `db_id`, `question`, `query`)
and one SQLite file per database, `database/<db_id>/<db_id>.sqlite`. `load_spider(dir, split)`
reads that layout; `make_tasks` is the config's generator: with `spider_dir` it reads a real
Spider directory, without it the set below, built on first use into alight's cache folder.

The bundled set (`recipes/spider/bundled.py`) is written for this project in Spider's layout: six
databases of different domains, a few hundred questions with gold SQL; see that file.

    python recipes/spider/bundled.py --out data/spider   # writes the set; point spider_dir at it
Config: `data.train: recipes/spider/data.py:make_tasks`, `data.generator_kwargs: {spider_dir: ...}`.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError

#: Question file of each split in a Spider directory (Spider calls its validation split "dev").
SPLIT_FILES = {"train": "train_spider.json", "val": "dev.json", "dev": "dev.json", "test": "test.json"}
_BUNDLED = Path(__file__).with_name("bundled.py")


# -- reading Spider's layout ----------------------------------------------------------------------


def load_spider(spider_dir: str | os.PathLike[str], split: str = "train") -> list[dict[str, Any]]:
    """The questions of one split of a Spider directory as task rows.

    Each row: `id`, `db_id`, `question`, `query` (the gold SQL), `db_path` (absolute path of the
    database's SQLite file) and `schema` (the compact schema text the agent prompts with).
    ConfigError when the directory, its question file, `tables.json` or a database is missing."""
    root = Path(spider_dir).expanduser()
    if split not in SPLIT_FILES:
        raise ConfigError(f"spider split must be one of {', '.join(SPLIT_FILES)}, got {split!r}")
    if not root.is_dir():
        raise ConfigError(f"spider_dir {root} is not a directory")
    test = split == "test"
    questions = _read_json(root / SPLIT_FILES[split])
    tables_file = root / "test_tables.json" if test and (root / "test_tables.json").exists() else root / "tables.json"
    schemas = {entry["db_id"]: schema_text(entry) for entry in _read_json(tables_file)}
    db_root = root / "test_database" if test and (root / "test_database").is_dir() else root / "database"
    rows = []
    for i, record in enumerate(questions):
        try:
            db_id, question, query = str(record["db_id"]), str(record["question"]), str(record["query"])
        except (KeyError, TypeError):
            raise ConfigError(f"{root / SPLIT_FILES[split]}: record {i} lacks db_id, question or query") from None
        if db_id not in schemas:
            raise ConfigError(f"{tables_file}: no schema for database {db_id!r} (record {i})")
        db_path = db_root / db_id / f"{db_id}.sqlite"
        if not db_path.is_file():
            raise ConfigError(f"spider database {db_path} does not exist")
        rows.append(
            {
                "id": f"{split}-{i}",
                "db_id": db_id,
                "question": question,
                "query": query,
                "db_path": str(db_path.resolve()),
                "schema": schemas[db_id],
            }
        )
    return rows


def schema_text(entry: dict[str, Any]) -> str:
    """One line per table, `table(column, ...)`, from a `tables.json` entry (original names: the
    ones SQL uses). Compact on purpose: with a byte tokenizer every character is a token."""
    tables: list[list[str]] = [[] for _ in entry["table_names_original"]]
    for table_index, column in entry["column_names_original"]:
        if table_index >= 0:
            tables[table_index].append(column)
    return "\n".join(
        f"{name}({', '.join(cols)})" for name, cols in zip(entry["table_names_original"], tables, strict=True)
    )


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"spider file {path} does not exist")
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"spider file {path} is not JSON: {err}") from None


def make_tasks(
    split: str = "train",
    n: int | None = None,
    seed: int = 0,
    spider_dir: str | None = None,
    max_turns: int = 2,
    time_limit_s: float = 2.0,
) -> list[dict[str, Any]]:
    """Task rows of `split` ("train" or "val"), shuffled by `seed`, at most `n`: from the Spider
    directory `spider_dir`, else from the bundled set. `max_turns` (queries the agent may write)
    and `time_limit_s` (per SQL execution) ride along in every row for the agent to read."""
    if max_turns < 1:
        raise ConfigError(f"spider max_turns must be at least 1, got {max_turns}")
    if not time_limit_s > 0:
        raise ConfigError(f"spider time_limit_s must be positive, got {time_limit_s}")
    if spider_dir is None:
        spider_dir = str(resolve_entrypoint(f"{_BUNDLED}:dataset_dir", what="spider recipe")())
    rows = load_spider(spider_dir, split)
    random.Random(seed).shuffle(rows)
    for row in rows:
        row["max_turns"], row["time_limit_s"] = max_turns, float(time_limit_s)
    return rows[:n] if n is not None else rows


def demonstrations(
    n: int | None = None, seed: int = 0, spider_dir: str | None = None, rewrite_rate: float = 0.25
) -> list[dict[str, Any]]:
    """SFT rows for the warm start: the writer's conversation (the agent's prompt, the gold query
    as the reply) for train questions, and for a `rewrite_rate` share of them the rewriter's, after
    a failed first query. Teaches a small model the reply format (bare SQL over the schema given),
    not the answers to dev questions: only the train split is used."""
    agent = Path(__file__).with_name("agent.py")
    write, rewrite = (
        resolve_entrypoint(f"{agent}:{name}", what="spider recipe") for name in ("WRITE_PROMPT", "REWRITE_PROMPT")
    )
    rows = make_tasks("train", seed=seed, spider_dir=spider_dir)
    rng = random.Random(seed)
    out = []
    for i in range(n if n is not None else len(rows)):
        row = rows[i % len(rows)]
        asked = f"{row['schema']}\nQuestion: {row['question']}"
        if rng.random() < rewrite_rate:
            failed = f"SELECT * FROM {row['db_id']}_x"
            asked += (
                f"\nSQL: {failed}\nResult: Error: no such table: {row['db_id']}_x\nFeedback: The table does not exist."
            )
            system = rewrite
        else:
            system = write
        messages = [{"role": "system", "content": system}, {"role": "user", "content": asked}]
        out.append({"messages": [*messages, {"role": "assistant", "content": row["query"]}]})
    return out
