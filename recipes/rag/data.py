"""The RAG recipe's questions: the shipped set, the loader that also reads real MuSiQue files and
corpora, and SFT demonstrations of the agent's conversation.

Rows have MuSiQue's fields: `id`, `question`, `answer`, `answer_aliases`, `paragraphs`
([{idx, title, paragraph_text, is_supporting}]), `question_decomposition` ([{id, question, answer,
paragraph_support_idx}], the second hop naming the first's answer as `#1`) and `answerable`. The
shipped set (`data/questions.jsonl`, its corpus `data/corpus.jsonl` of {id, title, text}) is
two-hop questions over an invented, consistent mini-world (`world.py`) plus handwritten ones. A
question belongs to val or train by a hash of its id.

    python recipes/rag/data.py --out recipes/rag/data     # (re)writes questions.jsonl, corpus.jsonl
Config: `data.train: recipes/rag/data.py:load_questions`; real data through `data.generator_kwargs`
(`questions: /path/musique_ans_v1.0_train.jsonl`, `corpus: /path/corpus.jsonl`, or no corpus: each
question's own paragraphs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
QUESTIONS_FILE = DATA_DIR / "questions.jsonl"
CORPUS_FILE = DATA_DIR / "corpus.jsonl"
SPLITS = ("train", "val")
VAL_PERCENT = 20  # share of questions in val

# The agent's instructions and tool, loaded the way alight loads the agent (same module object).
_AGENT = HERE / "agent.py"
build_dataset = resolve_entrypoint(f"{HERE / 'world.py'}:build_dataset", what="rag recipe")

# -- loading ---------------------------------------------------------------------------------


def split_of(row_id: str) -> str:
    """The split a question belongs to, fixed by a hash of its id."""
    bucket = int(hashlib.sha256(row_id.encode()).hexdigest()[:8], 16) % 100
    return "val" if bucket < VAL_PERCENT else "train"


def read_musique(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a MuSiQue jsonl file (one question object a line)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"questions file {file} does not exist")
    rows = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(f"{file} line {number} is not JSON") from None
            if not isinstance(row, dict) or not {"id", "question", "answer"} <= set(row):
                raise ConfigError(f"{file} line {number}: a MuSiQue row needs id, question, answer")
            rows.append(row)
    return rows


def load_questions(
    n: int | None = None,
    seed: int = 0,
    split: str = "train",
    questions: str | Mapping[str, str] | None = None,
    corpus: str | None = None,
    retrieval: str = "auto",
    embedding_model: str | None = None,
    cache_dir: str | None = None,
    top_k: int = 2,
    max_chars: int = 160,
    max_turns: int = 4,
    format_weight: float = 0.1,
    f1_weight: float = 0.9,
) -> list[dict[str, Any]]:
    """MuSiQue rows of `split` ("train" or "val"), each with the settings the agent reads.

    `questions`: None (the shipped set), a MuSiQue jsonl file (split by a hash of each id), or
    {"train": file, "val": file}. `corpus`: a jsonl of {id, title, text} searched by every
    question; None with the shipped set: its corpus; None with a questions file: each question's
    own `paragraphs`. Unanswerable rows (`answerable: false`) are left out. The rest of the
    arguments become each row's `search` ({corpus, method, model, cache_dir, top_k, max_chars}),
    `max_turns` and `reward` ({format_weight, f1_weight}) settings. The first `n` rows, shuffled by `seed`."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    if questions is None:
        rows = read_musique(QUESTIONS_FILE)
        corpus = corpus or str(CORPUS_FILE)
        rows = [row for row in rows if split_of(str(row["id"])) == split]
    elif isinstance(questions, Mapping):
        if split not in questions:
            raise ConfigError(f"questions names files for {sorted(questions)}, not for {split!r}")
        rows = read_musique(questions[split])
    else:
        rows = [row for row in read_musique(questions) if split_of(str(row["id"])) == split]
    rows = [row for row in rows if row.get("answerable", True)]
    if corpus is not None and not Path(corpus).expanduser().is_file():
        raise ConfigError(f"corpus file {corpus} does not exist")
    random.Random(f"{seed}:{split}").shuffle(rows)
    settings = {
        "search": {
            "corpus": None if corpus is None else str(Path(corpus).expanduser().resolve()),
            "method": retrieval,
            "model": embedding_model,
            "cache_dir": cache_dir,
            "top_k": top_k,
            "max_chars": max_chars,
        },
        "max_turns": max_turns,
        "reward": {"format_weight": format_weight, "f1_weight": f1_weight},
    }
    # the question first, so that `alight dev` shows it
    return [{"question": row["question"], **row, **settings} for row in rows[:n]]


# -- demonstrations --------------------------------------------------------------------------


def demonstrations(n: int = 1000, seed: int = 0, hops: int = 2, full_rate: float = 1.0) -> list[dict[str, Any]]:
    """SFT rows `{"messages", "tools"}` of train questions: the conversation the agent holds with
    the Agents SDK, searching each hop's entity (the first from the question, the second from the
    first result) and answering `<answer>...</answer>`. Search results are those of BM25 over the
    shipped corpus, formatted as the tool formats them.

    `full_rate`: the share of rows that search every hop; the rest answer after the first search
    (the format without the strategy, as calc's `tool_rate`: RL then learns that searching again
    pays). Drawn from an RNG of its own, so the rows at 1.0 are those of before the setting."""
    if not 0.0 <= full_rate <= 1.0:
        raise ConfigError(f"rag demonstrations: full_rate must be within [0, 1], got {full_rate}")
    agent = resolve_entrypoint(f"{_AGENT}:INSTRUCTIONS", what="rag recipe"), _agent_tool_schema()
    instructions, tool = agent
    format_results = resolve_entrypoint(f"{_AGENT}:format_results", what="rag recipe")
    retrieval = resolve_entrypoint(f"{HERE / 'retrieval.py'}:load_corpus", what="rag recipe")
    make_retriever = resolve_entrypoint(f"{HERE / 'retrieval.py'}:make_retriever", what="rag recipe")
    retriever = make_retriever(retrieval(CORPUS_FILE), method="bm25")
    rows = load_questions(None, seed=seed, split="train")
    rng, rate_rng = random.Random(f"{seed}:demonstrations"), random.Random(f"{seed}:full_rate")
    out = []
    while len(out) < n:
        row = rng.choice(rows)
        settings = row["search"]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": row["question"]},
        ]
        searched = hops if rate_rng.random() < full_rate else 1
        for step, hop in enumerate(row["question_decomposition"][:searched]):
            query = row["paragraphs"][hop["paragraph_support_idx"]]["title"]
            call_id = f"call_{step}"
            arguments = json.dumps({"query": query})
            call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": arguments}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            result = format_results(retriever.search(query, settings["top_k"]), settings["max_chars"])
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        messages.append({"role": "assistant", "content": f"<answer>{row['answer']}</answer>"})
        out.append({"messages": messages, "tools": [tool]})
    return out


def _agent_tool_schema() -> dict[str, Any]:
    from agents.models.chatcmpl_converter import Converter

    search = resolve_entrypoint(f"{_AGENT}:search", what="rag recipe")
    return dict(Converter.tool_to_openai(search))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def recall_at_k(retriever: Any, rows: list[dict[str, Any]], k: int) -> dict[str, float]:
    """Shares of questions for which `retriever.search(..., k)` finds: hop 1's paragraph from the
    question (`hop1_question`), hop 2's from hop 1's answer (`hop2_bridge`), and both supporting
    paragraphs from the question alone (`both_from_question`: what one search can do)."""
    hop1 = hop2 = both = 0
    for row in rows:
        first, second = row["question_decomposition"][:2]
        title1 = row["paragraphs"][first["paragraph_support_idx"]]["title"]
        title2 = row["paragraphs"][second["paragraph_support_idx"]]["title"]
        found = [passage.title for passage, _ in retriever.search(row["question"], k)]
        hop1 += title1 in found
        both += title1 in found and title2 in found
        hop2 += title2 in [passage.title for passage, _ in retriever.search(first["answer"], k)]
    n = max(len(rows), 1)
    return {"hop1_question": hop1 / n, "hop2_bridge": hop2 / n, "both_from_question": both / n}


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the rag recipe's questions.jsonl and corpus.jsonl.")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the invented world")
    parser.add_argument(
        "--recall", choices=("bm25", "embeddings"), help="print recall@1,2,5 of the shipped set instead"
    )
    args = parser.parse_args()
    if args.recall:
        retrieval = HERE / "retrieval.py"
        corpus = resolve_entrypoint(f"{retrieval}:load_corpus", what="rag recipe")(CORPUS_FILE)
        retriever = resolve_entrypoint(f"{retrieval}:make_retriever", what="rag recipe")(corpus, args.recall)
        rows = read_musique(QUESTIONS_FILE)
        results = {k: recall_at_k(retriever, rows, k) for k in (1, 2, 5)}
        print(json.dumps({"method": args.recall, "questions": len(rows), "recall_at_k": results}))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    questions, corpus_rows = build_dataset(args.seed)
    _write_jsonl(args.out / "questions.jsonl", questions)
    _write_jsonl(args.out / "corpus.jsonl", corpus_rows)
    print(f"wrote {len(questions)} questions and {len(corpus_rows)} passages to {args.out}")


if __name__ == "__main__":
    main()
