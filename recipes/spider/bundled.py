"""A small set in Spider's layout, written for this project: the recipe's default data.

Six databases of different domains (library, school, shop, concert; dev: flights, hospital) are
filled from a seeded RNG; questions come from templates over each schema (counts, filters,
aggregates, ORDER BY, GROUP BY, DISTINCT, joins along foreign keys) plus a few written by hand.
Every gold query runs at build time, and questions whose gold result is empty (any query returning
nothing would match them) or whose ORDER BY / LIMIT would be ambiguous under ties are left out.
As in Spider, train and dev use different databases, so dev measures a model on unseen schemas.
The files are built on first use into alight's cache folder (not committed: ~100 KB of binary
SQLite that this script rebuilds byte for byte from a seed).

    python recipes/spider/bundled.py --out data/spider    # writes tables.json, train_spider.json,
                                                          # dev.json, database/<db_id>/<db_id>.sqlite
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPLIT_FILES = {"train": "train_spider.json", "val": "dev.json"}
DEV_DATABASES = ("flights", "hospital")  # the dev split: databases that train never shows
FORMAT = 1  # bumped when the layout changes, so a cached copy is rebuilt


@dataclass(frozen=True)
class Column:
    name: str
    words: str  # how a question says it
    kind: str  # id | name (unique text) | cat (text from a few values) | num | fk
    values: tuple[Any, ...] = ()  # name/cat: the pool; num: (low, high)
    ref: str = ""  # fk: the table it points to


@dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    size: int
    columns: tuple[Column, ...]


def _id(table: str) -> Column:
    return Column(f"{table}_id", f"{table} id", "id")


def _fk(table: str) -> Column:
    return Column(f"{table}_id", f"{table} id", "fk", ref=table)


FIRST = ("Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jun", "Kofi", "Lena", "Milo", "Nia")
LAST = ("Adams", "Brook", "Costa", "Diaz", "Evans", "Fox", "Gray", "Hale", "Ito", "Jones", "Khan", "Lund")
PEOPLE = tuple(f"{a} {b}" for a in FIRST for b in LAST)
CITIES = ("Lisbon", "Oslo", "Lima", "Perth", "Quito", "Accra", "Hanoi", "Porto", "Cork", "Turin")
COUNTRIES = ("Portugal", "Norway", "Peru", "Ghana", "Chile", "Japan")

DATABASES: dict[str, tuple[Table, ...]] = {
    "library": (
        Table(
            "author",
            "author",
            "authors",
            12,
            (
                _id("author"),
                Column("name", "name", "name", PEOPLE),
                Column("country", "country", "cat", COUNTRIES),
                Column("birth_year", "birth year", "num", (1920, 1995)),
            ),
        ),
        Table(
            "book",
            "book",
            "books",
            30,
            (
                _id("book"),
                Column(
                    "title",
                    "title",
                    "name",
                    tuple(
                        f"The {a} {b}"
                        for a in ("Silent", "Red", "Last", "Hidden", "Broken", "Golden", "Lost")
                        for b in ("River", "Garden", "Letter", "Winter", "Island", "Road")
                    ),
                ),
                _fk("author"),
                Column("genre", "genre", "cat", ("novel", "poetry", "history", "science")),
                Column("pages", "number of pages", "num", (90, 900)),
                Column("year", "publication year", "num", (1950, 2023)),
            ),
        ),
        Table(
            "member",
            "member",
            "members",
            15,
            (
                _id("member"),
                Column("name", "name", "name", PEOPLE[40:]),
                Column("city", "city", "cat", CITIES[:4]),
                Column("age", "age", "num", (16, 80)),
            ),
        ),
        Table(
            "loan",
            "loan",
            "loans",
            40,
            (_id("loan"), _fk("book"), _fk("member"), Column("days", "number of days", "num", (1, 60))),
        ),
    ),
    "school": (
        Table(
            "teacher",
            "teacher",
            "teachers",
            8,
            (
                _id("teacher"),
                Column("name", "name", "name", PEOPLE[20:]),
                Column("subject", "subject", "cat", ("math", "art", "biology", "history")),
                Column("salary", "salary", "num", (30000, 90000)),
            ),
        ),
        Table(
            "course",
            "course",
            "courses",
            12,
            (
                _id("course"),
                Column(
                    "title",
                    "title",
                    "name",
                    tuple(
                        f"{a} {b}"
                        for a in ("Intro to", "Advanced", "Applied")
                        for b in ("Algebra", "Drawing", "Genetics", "Ecology", "Rome", "Painting", "Calculus")
                    ),
                ),
                _fk("teacher"),
                Column("credits", "number of credits", "num", (1, 6)),
            ),
        ),
        Table(
            "student",
            "student",
            "students",
            25,
            (
                _id("student"),
                Column("name", "name", "name", PEOPLE[60:]),
                Column("grade_level", "grade level", "cat", ("freshman", "sophomore", "junior", "senior")),
                Column("gpa", "GPA", "num", (20, 40)),
            ),
        ),
        Table(
            "enrollment",
            "enrollment",
            "enrollments",
            50,
            (_id("enrollment"), _fk("student"), _fk("course"), Column("score", "score", "num", (40, 100))),
        ),
    ),
    "shop": (
        Table(
            "customer",
            "customer",
            "customers",
            15,
            (
                _id("customer"),
                Column("name", "name", "name", PEOPLE[90:]),
                Column("city", "city", "cat", CITIES[3:8]),
                Column("age", "age", "num", (18, 75)),
            ),
        ),
        Table(
            "product",
            "product",
            "products",
            14,
            (
                _id("product"),
                Column(
                    "name",
                    "name",
                    "name",
                    tuple(
                        f"{a} {b}"
                        for a in ("Blue", "Steel", "Mini", "Smart", "Eco")
                        for b in ("Lamp", "Kettle", "Chair", "Desk", "Mug", "Fan")
                    ),
                ),
                Column("category", "category", "cat", ("kitchen", "office", "garden")),
                Column("price", "price", "num", (5, 400)),
                Column("stock", "stock", "num", (0, 120)),
            ),
        ),
        Table(
            "orders",
            "order",
            "orders",
            40,
            (
                _id("order"),
                _fk("customer"),
                _fk("product"),
                Column("quantity", "quantity", "num", (1, 9)),
                Column("status", "status", "cat", ("paid", "shipped", "returned")),
            ),
        ),
    ),
    "concert": (
        Table(
            "stadium",
            "stadium",
            "stadiums",
            8,
            (
                _id("stadium"),
                Column(
                    "name", "name", "name", tuple(f"{c} Arena" for c in CITIES) + tuple(f"{c} Park" for c in CITIES)
                ),
                Column("city", "city", "cat", CITIES[:5]),
                Column("capacity", "capacity", "num", (5000, 80000)),
            ),
        ),
        Table(
            "singer",
            "singer",
            "singers",
            14,
            (
                _id("singer"),
                Column("name", "name", "name", PEOPLE[120:]),
                Column("country", "country", "cat", COUNTRIES[:4]),
                Column("age", "age", "num", (19, 70)),
            ),
        ),
        Table(
            "show",
            "show",
            "shows",
            24,
            (
                _id("show"),
                _fk("stadium"),
                _fk("singer"),
                Column("year", "year", "num", (2010, 2024)),
                Column("tickets", "number of tickets sold", "num", (1000, 60000)),
            ),
        ),
    ),
    "flights": (
        Table(
            "airline",
            "airline",
            "airlines",
            7,
            (
                _id("airline"),
                Column("name", "name", "name", tuple(f"{c} Air" for c in CITIES)),
                Column("country", "country", "cat", COUNTRIES[:3]),
                Column("fleet_size", "fleet size", "num", (5, 300)),
            ),
        ),
        Table(
            "airport",
            "airport",
            "airports",
            10,
            (
                _id("airport"),
                Column("code", "code", "name", ("LIS", "OSL", "LIM", "PER", "UIO", "ACC", "HAN", "OPO", "ORK", "TRN")),
                Column("city", "city", "name", CITIES),
                Column("runways", "number of runways", "num", (1, 6)),
            ),
        ),
        Table(
            "flight",
            "flight",
            "flights",
            45,
            (
                _id("flight"),
                _fk("airline"),
                Column("origin", "origin airport id", "fk", ref="airport"),
                Column("distance", "distance", "num", (200, 9000)),
                Column("price", "price", "num", (40, 1500)),
            ),
        ),
    ),
    "hospital": (
        Table(
            "doctor",
            "doctor",
            "doctors",
            9,
            (
                _id("doctor"),
                Column("name", "name", "name", PEOPLE[30:]),
                Column("specialty", "specialty", "cat", ("cardiology", "surgery", "pediatrics")),
                Column("years_experience", "years of experience", "num", (1, 35)),
            ),
        ),
        Table(
            "patient",
            "patient",
            "patients",
            20,
            (
                _id("patient"),
                Column("name", "name", "name", PEOPLE[100:]),
                Column("city", "city", "cat", CITIES[5:]),
                Column("age", "age", "num", (1, 95)),
            ),
        ),
        Table(
            "visit",
            "visit",
            "visits",
            45,
            (
                _id("visit"),
                _fk("doctor"),
                _fk("patient"),
                Column("cost", "cost", "num", (20, 900)),
                Column("ward", "ward", "cat", ("A", "B", "C")),
            ),
        ),
    ),
}

# Questions written by hand (db_id, question, gold SQL): shapes the templates do not make.
HANDWRITTEN: tuple[tuple[str, str, str], ...] = (
    (
        "library",
        "Which members borrowed a poetry book? Give their names without repeats.",
        "SELECT DISTINCT T3.name FROM loan AS T1 JOIN book AS T2 ON T1.book_id = T2.book_id "
        "JOIN member AS T3 ON T1.member_id = T3.member_id WHERE T2.genre = 'poetry'",
    ),
    (
        "library",
        "How many books were never borrowed?",
        "SELECT count(*) FROM book WHERE book_id NOT IN (SELECT book_id FROM loan)",
    ),
    (
        "library",
        "What is the total number of pages of books by authors from Japan?",
        "SELECT sum(T1.pages) FROM book AS T1 JOIN author AS T2 ON T1.author_id = T2.author_id "
        "WHERE T2.country = 'Japan'",
    ),
    (
        "school",
        "List the names of students whose GPA is above the average GPA.",
        "SELECT name FROM student WHERE gpa > (SELECT avg(gpa) FROM student)",
    ),
    (
        "school",
        "What is the average score in courses taught by math teachers?",
        "SELECT avg(T1.score) FROM enrollment AS T1 JOIN course AS T2 ON T1.course_id = T2.course_id "
        "JOIN teacher AS T3 ON T2.teacher_id = T3.teacher_id WHERE T3.subject = 'math'",
    ),
    (
        "shop",
        "What is the total revenue of paid orders (price times quantity)?",
        "SELECT sum(T2.price * T1.quantity) FROM orders AS T1 JOIN product AS T2 ON T1.product_id = T2.product_id "
        "WHERE T1.status = 'paid'",
    ),
    ("shop", "Which products are out of stock? List their names.", "SELECT name FROM product WHERE stock < 10"),
    (
        "concert",
        "How many tickets were sold in total in each year? Show the year and the total.",
        "SELECT year, sum(tickets) FROM show GROUP BY year",
    ),
    (
        "concert",
        "List the names of singers who never had a show.",
        "SELECT name FROM singer WHERE singer_id NOT IN (SELECT singer_id FROM show)",
    ),
    (
        "flights",
        "What is the average price of flights longer than 3000?",
        "SELECT avg(price) FROM flight WHERE distance > 3000",
    ),
    (
        "flights",
        "Which airlines have no flights? List their names.",
        "SELECT name FROM airline WHERE airline_id NOT IN (SELECT airline_id FROM flight)",
    ),
    (
        "hospital",
        "What is the average age of patients who visited a surgeon?",
        "SELECT avg(age) FROM patient WHERE patient_id IN (SELECT T1.patient_id FROM visit AS T1 "
        "JOIN doctor AS T2 ON T1.doctor_id = T2.doctor_id WHERE T2.specialty = 'surgery')",
    ),
    (
        "hospital",
        "List the names of doctors with more than five visits.",
        "SELECT T2.name FROM visit AS T1 JOIN doctor AS T2 ON T1.doctor_id = T2.doctor_id GROUP BY T2.name "
        "HAVING count(*) > 5",
    ),
    (
        "flights",
        "List the codes of airports in Lima or Oslo.",
        "SELECT code FROM airport WHERE city = 'Lima' OR city = 'Oslo'",
    ),
)


def _fill(table: Table, rng: random.Random) -> list[tuple[Any, ...]]:
    rows = []
    names = {c.name: rng.sample(c.values, table.size) for c in table.columns if c.kind == "name"}
    for i in range(1, table.size + 1):
        row: list[Any] = []
        for c in table.columns:
            if c.kind == "id":
                row.append(i)
            elif c.kind == "name":
                row.append(names[c.name][i - 1])
            elif c.kind == "cat":
                row.append(rng.choice(c.values))
            elif c.kind == "num":
                row.append(rng.randint(c.values[0], c.values[1]))
            else:  # fk: filled once the referenced table's size is known
                row.append(None)
        rows.append(tuple(row))
    return rows


def _build_database(path: Path, tables: tuple[Table, ...], rng: random.Random) -> None:
    sizes = {t.name: t.size for t in tables}
    with sqlite3.connect(path) as conn:
        for t in tables:
            columns = []
            for c in t.columns:
                kind = "INTEGER" if c.kind in ("id", "num", "fk") else "TEXT"
                extra = " PRIMARY KEY" if c.kind == "id" else ""
                if c.kind == "fk":
                    extra = f" REFERENCES {c.ref}({c.ref}_id)"
                columns.append(f"{c.name} {kind}{extra}")
            conn.execute(f"CREATE TABLE {t.name} ({', '.join(columns)})")
            rows = [
                tuple(
                    rng.randint(1, sizes[c.ref]) if c.kind == "fk" else v for c, v in zip(t.columns, row, strict=True)
                )
                for row in _fill(t, rng)
            ]
            conn.executemany(f"INSERT INTO {t.name} VALUES ({', '.join('?' * len(t.columns))})", rows)
    conn.close()


def _tables_entry(db_id: str, tables: tuple[Table, ...]) -> dict[str, Any]:
    names: list[list[Any]] = [[-1, "*"]]
    originals: list[list[Any]] = [[-1, "*"]]
    types, primary, foreign = ["text"], [], []
    where: dict[tuple[str, str], int] = {}
    for ti, t in enumerate(tables):
        for c in t.columns:
            where[(t.name, c.name)] = len(originals)
            names.append([ti, c.words])
            originals.append([ti, c.name])
            types.append("text" if c.kind in ("name", "cat") else "number")
            if c.kind == "id":
                primary.append(len(originals) - 1)
    for t in tables:
        for c in t.columns:
            if c.kind == "fk":
                foreign.append([where[(t.name, c.name)], where[(c.ref, f"{c.ref}_id")]])
    return {
        "db_id": db_id,
        "table_names": [t.plural for t in tables],
        "table_names_original": [t.name for t in tables],
        "column_names": names,
        "column_names_original": originals,
        "column_types": types,
        "primary_keys": primary,
        "foreign_keys": foreign,
    }


def _questions(
    db_id: str, tables: tuple[Table, ...], conn: sqlite3.Connection, rng: random.Random
) -> Iterator[tuple[str, str]]:
    by_name = {t.name: t for t in tables}

    def values(sql: str) -> list[Any]:
        return [r[0] for r in conn.execute(sql).fetchall()]

    def unique(sql: str) -> bool:  # an ORDER BY / LIMIT question is well posed only without ties
        got = values(sql)
        return len(got) == len(set(got))

    for t in tables:
        name = next((c for c in t.columns if c.kind == "name"), None)
        cats = [c for c in t.columns if c.kind == "cat"]
        nums = [c for c in t.columns if c.kind == "num"]
        yield f"How many {t.plural} are there?", f"SELECT count(*) FROM {t.name}"
        if name is not None:
            yield f"List the {name.words} of all {t.plural}.", f"SELECT {name.name} FROM {t.name}"
        for c in cats:
            yield f"List the distinct {c.words} values of {t.plural}.", f"SELECT DISTINCT {c.name} FROM {t.name}"
            yield (
                f"For each {c.words}, how many {t.plural} are there?",
                f"SELECT {c.name}, count(*) FROM {t.name} GROUP BY {c.name}",
            )
            for v in rng.sample(sorted(set(values(f"SELECT {c.name} FROM {t.name}"))), 3):
                yield (
                    f"How many {t.plural} have {c.words} {v}?",
                    f"SELECT count(*) FROM {t.name} WHERE {c.name} = '{v}'",
                )
                if name is not None:
                    yield (
                        f"List the {name.words} of {t.plural} whose {c.words} is {v}.",
                        f"SELECT {name.name} FROM {t.name} WHERE {c.name} = '{v}'",
                    )
        for c in nums:
            aggs = (("average", "avg"), ("maximum", "max"), ("minimum", "min"), ("total", "sum"))
            for word, fn in rng.sample(aggs, 2):
                yield f"What is the {word} {c.words} of all {t.plural}?", f"SELECT {fn}({c.name}) FROM {t.name}"
            middle = sorted(values(f"SELECT {c.name} FROM {t.name}"))[t.size // 2]
            yield (
                f"How many {t.plural} have {c.words} above {middle}?",
                f"SELECT count(*) FROM {t.name} WHERE {c.name} > {middle}",
            )
            if name is None:
                continue
            yield (
                f"List the {name.words} of {t.plural} with {c.words} above {middle}.",
                f"SELECT {name.name} FROM {t.name} WHERE {c.name} > {middle}",
            )
            if unique(f"SELECT {c.name} FROM {t.name}"):
                yield (
                    f"List the {name.words} of all {t.plural} from highest to lowest {c.words}.",
                    f"SELECT {name.name} FROM {t.name} ORDER BY {c.name} DESC",
                )
            if unique(f"SELECT {c.name} FROM {t.name} ORDER BY {c.name} DESC LIMIT 2"):
                yield (
                    f"Which {t.singular} has the highest {c.words}? Give its {name.words}.",
                    f"SELECT {name.name} FROM {t.name} ORDER BY {c.name} DESC LIMIT 1",
                )
        for c in (c for c in t.columns if c.kind == "fk"):
            parent = by_name[c.ref]
            pname = next((p for p in parent.columns if p.kind == "name"), None)
            if pname is None:
                continue
            join = f"FROM {t.name} AS T1 JOIN {parent.name} AS T2 ON T1.{c.name} = T2.{c.ref}_id"
            yield (
                f"For each {parent.singular}, how many {t.plural} are there? Give the {pname.words} and the count.",
                f"SELECT T2.{pname.name}, count(*) {join} GROUP BY T2.{pname.name}",
            )
            for v in rng.sample(values(f"SELECT DISTINCT T2.{pname.name} {join}"), 3):
                if name is not None:
                    yield (
                        f"List the {name.words} of {t.plural} whose {parent.singular} is {v}.",
                        f"SELECT T1.{name.name} {join} WHERE T2.{pname.name} = '{v}'",
                    )
                else:
                    yield (
                        f"How many {t.plural} are there for the {parent.singular} {v}?",
                        f"SELECT count(*) {join} WHERE T2.{pname.name} = '{v}'",
                    )
            if unique(f"SELECT count(*) {join} GROUP BY T2.{pname.name} ORDER BY count(*) DESC LIMIT 2"):
                yield (
                    f"Which {parent.singular} has the most {t.plural}? Give its {pname.words}.",
                    f"SELECT T2.{pname.name} {join} GROUP BY T2.{pname.name} ORDER BY count(*) DESC LIMIT 1",
                )
    for hand_db, question, query in HANDWRITTEN:
        if hand_db == db_id:
            yield question, query


def build_dataset(out_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the bundled set in Spider's layout to `out_dir` (databases, `tables.json`,
    `train_spider.json`, `dev.json`); the same seed gives the same files. Every gold query runs,
    and questions whose gold result is empty (any query would match it) are left out."""
    out = Path(out_dir)
    tables_json: list[dict[str, Any]] = []
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for db_id, tables in DATABASES.items():
        rng = random.Random(f"{seed}-{db_id}")
        db_dir = out / "database" / db_id
        db_dir.mkdir(parents=True, exist_ok=True)
        db_path = db_dir / f"{db_id}.sqlite"
        db_path.unlink(missing_ok=True)
        _build_database(db_path, tables, rng)
        tables_json.append(_tables_entry(db_id, tables))
        split = "val" if db_id in DEV_DATABASES else "train"
        conn = sqlite3.connect(db_path)
        seen = set()
        for question, query in _questions(db_id, tables, conn, rng):
            if question in seen or not conn.execute(query).fetchall():
                continue
            seen.add(question)
            splits[split].append(
                {
                    "db_id": db_id,
                    "question": question,
                    "question_toks": question.split(),
                    "query": query,
                    "query_toks": query.split(),
                }
            )
        conn.close()
    (out / "tables.json").write_text(json.dumps(tables_json, indent=1) + "\n")
    (out / SPLIT_FILES["train"]).write_text(json.dumps(splits["train"], indent=1) + "\n")
    (out / SPLIT_FILES["val"]).write_text(json.dumps(splits["val"], indent=1) + "\n")
    return out


def dataset_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The bundled set's directory, built on first use under `cache_dir` (default: alight's cache
    folder, $XDG_CACHE_HOME/alight or ~/.cache/alight). The folder name carries a hash of this
    file, so an edited builder builds afresh; a half-written set is never visible."""
    base = (
        Path(cache_dir)
        if cache_dir is not None
        else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alight"
    )
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    path = base / f"spider-{FORMAT}-{digest}"
    if (path / "tables.json").is_file():
        return path
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=base, prefix=f".{path.name}."))
    try:
        build_dataset(staging)
        try:
            os.rename(staging, path)
        except OSError:  # another process built it first
            if not (path / "tables.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the bundled Spider-layout set.")
    parser.add_argument("--out", required=True, help="directory to write (Spider's layout)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = build_dataset(args.out, seed=args.seed)
    for split, name in SPLIT_FILES.items():
        print(f"{split}: {len(json.loads((out / name).read_text()))} questions in {out / name}")


if __name__ == "__main__":
    main()
