"""The Spider recipe (recipes/spider/): the Spider-layout loader, the bundled set, SQL execution
(read-only, time-limited), Spider's execution accuracy, and the LangGraph agent itself against a
scripted OpenAI-compatible server (a test fixture standing in for a model) on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from alight import LLM
from alight.data import load_rows
from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.recipes.spider_script import CHECK_PROMPT, REWRITE_PROMPT, WRITE_PROMPT, Plan, plans_for, spider_script

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "spider"


def attr(module: str, name: str) -> Any:
    return resolve_entrypoint(f"{RECIPE / module}:{name}")  # loaded as alight loads the recipe


execute_sql = attr("agent.py", "execute_sql")
execution_accuracy = attr("agent.py", "execution_accuracy")
results_match = attr("agent.py", "results_match")
extract_sql = attr("agent.py", "extract_sql")
sql_agent = attr("agent.py", "sql_agent")
load_spider = attr("data.py", "load_spider")
make_tasks = attr("data.py", "make_tasks")
demonstrations = attr("data.py", "demonstrations")
build_dataset = attr("bundled.py", "build_dataset")
dataset_dir = attr("bundled.py", "dataset_dir")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(build_dataset(tmp_path_factory.mktemp("spider")))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A small database: t(a, b) with a duplicate row."""
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "x"), (2, "y"), (2, "y"), (3, "z")])
    conn.close()
    return path


# -- the bundled set and the loader -----------------------------------------------------------------


def test_bundled_set_is_spider_layout_with_running_gold_queries(bundled: Path) -> None:
    tables = json.loads((bundled / "tables.json").read_text())
    assert {t["db_id"] for t in tables} == {"library", "school", "shop", "concert", "flights", "hospital"}
    train, dev = load_spider(bundled, "train"), load_spider(bundled, "val")
    assert len(train) + len(dev) >= 300 and len(dev) >= 80
    assert {r["db_id"] for r in dev} == {"flights", "hospital"}  # dev databases are never seen in training
    assert not {r["db_id"] for r in train} & {"flights", "hospital"}
    assert len({(r["db_id"], r["question"]) for r in train + dev}) == len(train) + len(dev)
    for row in train + dev:
        assert execute_sql(row["db_path"], row["query"])  # every gold query runs and returns rows
        assert row["db_path"].endswith(f"database/{row['db_id']}/{row['db_id']}.sqlite")
    shapes = " ".join(r["query"] for r in train + dev)
    for keyword in ("ORDER BY", "GROUP BY", "DISTINCT", "JOIN", "count(*)", "NOT IN", "HAVING"):
        assert keyword in shapes
    first = load_spider(bundled, "train")[0]
    assert first["schema"].splitlines()[0] == "author(author_id, name, country, birth_year)"


def test_bundled_set_is_byte_identical_when_rebuilt(bundled: Path, tmp_path: Path) -> None:
    again = Path(build_dataset(tmp_path / "again"))
    for path in sorted(p for p in bundled.rglob("*") if p.is_file()):
        rebuilt = again / path.relative_to(bundled)
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(rebuilt.read_bytes()).digest(), path


def test_the_cache_builds_once_and_reuses(tmp_path: Path) -> None:
    first = dataset_dir(tmp_path)
    stamp = (first / "tables.json").stat().st_mtime_ns
    assert dataset_dir(tmp_path) == first and (first / "tables.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging folder left behind


def _write_spider_dir(root: Path) -> Path:
    """A two-database Spider directory as the real one is laid out (tables.json, question files,
    database/<db_id>/<db_id>.sqlite), records carrying Spider's extra fields."""
    tables = []
    for db_id, table, columns in (("pets", "pet", ("pet_id", "kind")), ("cars", "car", ("car_id", "make"))):
        path = root / "database" / db_id / f"{db_id}.sqlite"
        path.parent.mkdir(parents=True)
        with sqlite3.connect(path) as conn:
            conn.execute(f"CREATE TABLE {table} ({columns[0]} INTEGER PRIMARY KEY, {columns[1]} TEXT)")
            conn.execute(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
        conn.close()
        tables.append(
            {
                "db_id": db_id,
                "table_names": [table],
                "table_names_original": [table],
                "column_names": [[-1, "*"], [0, columns[0]], [0, columns[1]]],
                "column_names_original": [[-1, "*"], [0, columns[0]], [0, columns[1]]],
                "column_types": ["text", "number", "text"],
                "primary_keys": [1],
                "foreign_keys": [],
            }
        )
    (root / "tables.json").write_text(json.dumps(tables))
    record = {"query_toks": [], "question_toks": [], "sql": {}}
    train = [
        {**record, "db_id": "pets", "question": "How many pets?", "query": "SELECT count(*) FROM pet"},
        {**record, "db_id": "pets", "question": "Kinds?", "query": "SELECT kind FROM pet"},
        {**record, "db_id": "cars", "question": "Makes?", "query": "SELECT make FROM car"},
    ]
    (root / "train_spider.json").write_text(json.dumps(train))
    (root / "dev.json").write_text(json.dumps([{**record, "db_id": "cars", "question": "Cars?", "query": "SELECT 1"}]))
    return root


def test_loader_reads_a_spider_directory(tmp_path: Path) -> None:
    root = _write_spider_dir(tmp_path / "spider")
    rows = load_spider(root, "train")
    assert [(r["db_id"], r["question"], r["query"]) for r in rows] == [
        ("pets", "How many pets?", "SELECT count(*) FROM pet"),
        ("pets", "Kinds?", "SELECT kind FROM pet"),
        ("cars", "Makes?", "SELECT make FROM car"),
    ]
    assert rows[0]["schema"] == "pet(pet_id, kind)" and rows[2]["schema"] == "car(car_id, make)"
    assert rows[2]["db_path"] == str((root / "database" / "cars" / "cars.sqlite").resolve())
    assert execute_sql(rows[0]["db_path"], rows[0]["query"]) == [(2,)]
    assert [r["question"] for r in load_spider(root, "val")] == ["Cars?"]


def test_alight_loads_real_spider_through_generator_kwargs(tmp_path: Path) -> None:
    root = _write_spider_dir(tmp_path / "spider")
    kwargs = {"spider_dir": str(root), "max_turns": 3, "time_limit_s": 0.5}
    spec = f"{RECIPE / 'data.py'}:make_tasks"
    rows = load_rows(spec, size=2, seed=1, generator_kwargs=kwargs, split="train")
    assert len(rows) == 2 and all(r["max_turns"] == 3 and r["time_limit_s"] == 0.5 for r in rows)
    everything = load_rows(spec, seed=1, generator_kwargs=kwargs, split="train")
    assert sorted(r["question"] for r in everything) == ["How many pets?", "Kinds?", "Makes?"]
    assert everything == load_rows(spec, seed=1, generator_kwargs=kwargs, split="train")  # seeded order
    assert [r["question"] for r in load_rows(spec, generator_kwargs=kwargs, split="val")] == ["Cars?"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: (root / "dev.json").unlink(), "dev.json does not exist"),
        (lambda root: (root / "database" / "cars" / "cars.sqlite").unlink(), "cars.sqlite does not exist"),
        (lambda root: (root / "tables.json").write_text("{not json"), "tables.json is not JSON"),
        (lambda root: (root / "dev.json").write_text('[{"db_id": "cars"}]'), "record 0 lacks"),
        (lambda root: (root / "dev.json").write_text('[{"db_id": "zoo", "question": "q", "query": "q"}]'), "'zoo'"),
    ],
)
def test_a_broken_spider_directory_is_a_one_line_config_error(tmp_path: Path, damage: Any, message: str) -> None:
    root = _write_spider_dir(tmp_path / "spider")
    damage(root)
    with pytest.raises(ConfigError, match=message) as caught:
        load_spider(root, "val")
    assert "\n" not in str(caught.value)


def test_bad_loader_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        load_spider(tmp_path / "missing", "train")
    with pytest.raises(ConfigError, match="split"):
        load_spider(tmp_path, "validation")
    with pytest.raises(ConfigError, match="max_turns"):
        make_tasks("train", spider_dir=str(tmp_path), max_turns=0)


def test_demonstrations_teach_the_writer_and_rewriter_format_with_train_sql(bundled: Path) -> None:
    rows = demonstrations(40, seed=0, spider_dir=str(bundled))
    train_sql = {r["query"] for r in load_spider(bundled, "train")}
    systems = [r["messages"][0]["content"] for r in rows]
    assert set(systems) == {WRITE_PROMPT, REWRITE_PROMPT}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant"] and row["messages"][2]["content"] in train_sql


# -- execution and execution accuracy ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "gold", "ordered", "match"),
    [
        ([(1,), (2,)], [(2,), (1,)], False, True),  # order does not matter without ORDER BY
        ([(1,), (2,)], [(2,), (1,)], True, False),  # ... and does with it
        ([(1,), (2,)], [(1,), (2,)], True, True),
        ([(2,), (2,)], [(2,)], False, False),  # duplicates count (a multiset, not a set)
        ([(2,)], [(2,), (2,)], False, False),
        ([(1, "a")], [("a", 1)], False, False),  # column order matters
        ([(1.0,)], [(1,)], False, True),  # 1.0 == 1, as SQLite compares them
        ([], [], False, True),
        ([(None,)], [(None,)], False, True),
    ],
)
def test_results_match_is_spiders_execution_match(predicted: Any, gold: Any, ordered: bool, match: bool) -> None:
    assert results_match(predicted, gold, ordered) is match


@pytest.mark.parametrize(
    ("predicted", "gold", "accuracy"),
    [
        ("SELECT a FROM t", "SELECT a FROM t ORDER BY b DESC, a DESC", 0.0),  # gold orders: order must match
        ("SELECT a FROM t ORDER BY a DESC", "SELECT a FROM t ORDER BY b DESC, a DESC", 1.0),
        ("SELECT a FROM t ORDER BY a DESC", "SELECT a FROM t", 1.0),  # gold does not order: any order
        ("select a from t where a > 0", "SELECT a FROM t", 1.0),
        ("SELECT DISTINCT a FROM t", "SELECT a FROM t", 0.0),  # lost the duplicate
        ("SELECT b, a FROM t", "SELECT a, b FROM t", 0.0),
        ("SELECT count(*) FROM t", "SELECT count(*) FROM t WHERE a > 0", 1.0),
        ("SELECT nope FROM t", "SELECT a FROM t", 0.0),  # does not run
        ("", "SELECT a FROM t", 0.0),
        (None, "SELECT a FROM t", 0.0),
        ("SELECT a FROM t; SELECT a FROM t", "SELECT a FROM t", 0.0),  # one statement only
    ],
)
def test_execution_accuracy(db: Path, predicted: str | None, gold: str, accuracy: float) -> None:
    assert execution_accuracy(str(db), predicted, gold) == accuracy


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO t VALUES (9, 'w')",
        "DELETE FROM t",
        "DROP TABLE t",
        "CREATE TABLE u (x)",
        "UPDATE t SET a = 0",
        "PRAGMA user_version = 7",
        "VACUUM",
    ],
)
def test_execution_is_read_only(db: Path, statement: str) -> None:
    before = db.read_bytes()
    with pytest.raises(sqlite3.Error):
        execute_sql(str(db), statement)
    assert db.read_bytes() == before
    assert execute_sql(str(db), "SELECT count(*) FROM t") == [(4,)]


def test_execution_attaches_and_creates_no_file(db: Path, tmp_path: Path) -> None:
    with pytest.raises(sqlite3.Error):
        execute_sql(str(db), f"ATTACH DATABASE '{tmp_path / 'new.sqlite'}' AS other")
    assert not (tmp_path / "new.sqlite").exists()
    with pytest.raises(sqlite3.Error):
        execute_sql(str(tmp_path / "absent.sqlite"), "SELECT 1")
    assert not (tmp_path / "absent.sqlite").exists()  # a read-only open never creates the database


def test_a_runaway_query_is_interrupted_at_the_time_limit(db: Path) -> None:
    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        execute_sql(str(db), forever, time_limit_s=0.3)
    assert time.monotonic() - started < 2.0
    assert execution_accuracy(str(db), forever, "SELECT 1", time_limit_s=0.3) == 0.0


def test_an_empty_query_fails(db: Path) -> None:
    for sql in ("", "  ", ";", " ; "):
        with pytest.raises(sqlite3.OperationalError, match="empty"):
            execute_sql(str(db), sql)


@pytest.mark.parametrize(
    ("reply", "sql"),
    [
        ("SELECT 1", "SELECT 1"),
        ("  SELECT a FROM t;\n", "SELECT a FROM t;"),
        ("Here:\n```sql\nSELECT a\nFROM t\n```\nDone.", "SELECT a\nFROM t"),
        ("```\nSELECT 2\n```", "SELECT 2"),
        ("```SQLite SELECT 3```", "SELECT 3"),
    ],
)
def test_extract_sql(reply: str, sql: str) -> None:
    assert extract_sql(reply) == sql


@pytest.mark.parametrize(
    ("tool", "arguments", "sql"),
    [
        ("run_sql", {"sql": "SELECT 1"}, "SELECT 1"),
        ("anything", {"sql": "SELECT 1"}, "SELECT 1"),
        ("sql_db_query", {"query": "SELECT 2"}, "SELECT 2"),  # LangChain's SQL toolkit
        ("sql_db_query", "SELECT 3", "SELECT 3"),
        ("search", {"query": "capital of Peru"}, None),  # a `query` of a non-SQL tool is not SQL
        ("search", "capital of Peru", None),
        ("run_sql", {"sql": "  "}, None),
        ("run_sql", {"sql": 3}, None),
    ],
)
def test_langchain_tool_spans_name_the_sql_they_ran(tool: str, arguments: Any, sql: str | None) -> None:
    pytest.importorskip("langchain_core")
    from alight.tracing.langchain import sql_argument

    assert sql_argument(tool, arguments) == sql


# -- the agent against a scripted server (a test fixture standing in for a model) ---------------------


def _requests_by_prompt(server: ScriptedOpenAIServer) -> list[str]:
    names = {WRITE_PROMPT: "write", CHECK_PROMPT: "check", REWRITE_PROMPT: "rewrite"}
    return [names[r.body["messages"][0]["content"]] for r in server.requests]


@pytest.mark.parametrize(
    ("kind", "reward", "calls"),
    [
        ("correct", 1.0, ["write", "check"]),
        ("wrong", 0.0, ["write", "check"]),  # runs, fools the checker, wrong rows
        ("broken", 0.0, ["write", "check", "rewrite"]),  # max_turns 2: the last turn skips the checker
        ("fixed", 1.0, ["write", "check", "rewrite"]),
    ],
)
def test_the_agent_loops_until_the_checker_accepts_or_max_turns(
    bundled: Path, kind: str, reward: float, calls: list[str]
) -> None:
    pytest.importorskip("langgraph")
    task = make_tasks("val", spider_dir=str(bundled), max_turns=2)[0]
    with ScriptedOpenAIServer(spider_script(plans_for([task], [kind]))) as server:
        got = asyncio.run(sql_agent(task, LLM(model="scripted", base_url=server.url, api_key="x")))
        assert got == reward
        assert _requests_by_prompt(server) == calls
        user = server.requests[0].body["messages"][1]["content"]
        assert user == f"{task['schema']}\nQuestion: {task['question']}"
        if kind in ("broken", "fixed"):  # the rewriter sees the failed query, its error and the feedback
            shown = server.requests[-1].body["messages"][1]["content"]
            plan: Plan = plans_for([task], [kind])[task["question"]]
            assert f"SQL: {plan.write}\nResult: Error: " in shown and shown.endswith(f"Feedback: {plan.check}")


def test_the_agent_stops_at_max_turns(bundled: Path) -> None:
    pytest.importorskip("langgraph")
    task = make_tasks("val", spider_dir=str(bundled), max_turns=4)[0]
    with ScriptedOpenAIServer(spider_script(plans_for([task], ["broken"]))) as server:
        assert asyncio.run(sql_agent(task, LLM(model="scripted", base_url=server.url, api_key="x"))) == 0.0
        assert _requests_by_prompt(server) == ["write", "check", "rewrite", "check", "rewrite", "check", "rewrite"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.generator_kwargs.spider_dir=/no/such/spider", "error: spider_dir /no/such/spider is not a directory"),
        ("data.generator_kwargs.max_turns=0", "error: spider max_turns must be at least 1, got 0"),
    ],
)
def test_cli_reports_bad_spider_settings_in_one_line(override: str, message: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "alight", "dev", "configs/spider.yaml", "--n", "1", override],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == message
