"""A retrieval-augmented question answerer written with the OpenAI Agents SDK: the RAG recipe.

One agent, "rag", with one function tool, `search(query)`, over a local corpus (sentence
embeddings with cosine similarity, or BM25: `retrieval.py`). It answers multi-hop questions
(MuSiQue's layout: `data.py`) by searching, possibly again for what the results name, and
replying `<answer>...</answer>`. The reward is the paper's: a weighted sum of a format score (one
non-empty `<answer>` tag) and the token F1 of the answer against the gold answer and its aliases.
Nothing in it is alight-specific except the decorator and the base URL, model and key it is handed.
"""

from __future__ import annotations

import logging
import os
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI

import alight
from alight.entrypoints import resolve_entrypoint

logger = logging.getLogger(__name__)

_RETRIEVAL = Path(__file__).with_name("retrieval.py")
load_corpus = resolve_entrypoint(f"{_RETRIEVAL}:load_corpus", what="rag recipe")
make_retriever = resolve_entrypoint(f"{_RETRIEVAL}:make_retriever", what="rag recipe")
Passage = resolve_entrypoint(f"{_RETRIEVAL}:Passage", what="rag recipe")

# Short on purpose: with the tiny model's byte tokenizer every character is a token of every prompt.
INSTRUCTIONS = "Use search to find facts, again for names it gives. Reply <answer>short answer</answer>."
AGENT_NAME = "rag"
DEFAULT_SEARCH = {"corpus": None, "method": "auto", "model": None, "cache_dir": None, "top_k": 2, "max_chars": 160}
DEFAULT_REWARD = {"format_weight": 0.1, "f1_weight": 0.9}
DEFAULT_MAX_TURNS = 4
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

_retrievers: dict[tuple[Any, ...], Any] = {}  # one per corpus and setting, kept for the process's later tasks


@dataclass
class SearchContext:
    """What the `search` tool reads from the run's context."""

    retriever: Any
    top_k: int
    max_chars: int


@function_tool
def search(ctx: RunContextWrapper[SearchContext], query: str) -> str:
    """Search the corpus.

    Args:
        query: words to look for.
    """
    hits = ctx.context.retriever.search(query, ctx.context.top_k)
    return format_results(hits, ctx.context.max_chars)


def format_results(hits: Sequence[tuple[Any, float]], max_chars: int) -> str:
    """One line per passage, `title: text` (just the text when it starts with the title), each cut
    to `max_chars` characters."""
    if not hits:
        return "no results"
    lines = (p.text if p.text.startswith(p.title) else f"{p.title}: {p.text}" for p, _ in hits)
    return "\n".join(line[:max_chars] for line in lines)


@alight.rollout
async def answer(task: dict[str, Any], llm: alight.LLM) -> float:
    """Answer `task["question"]` with the search tool; the reward of the final output (see `reward`)."""
    settings = {**DEFAULT_SEARCH, **(task.get("search") or {})}
    weights = {**DEFAULT_REWARD, **(task.get("reward") or {})}
    context = SearchContext(retriever_for(task, settings), int(settings["top_k"]), int(settings["max_chars"]))
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
    agent = Agent[SearchContext](
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        tools=[search],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
    )
    try:
        result = await Runner.run(
            agent, task["question"], context=context, max_turns=int(task.get("max_turns") or DEFAULT_MAX_TURNS)
        )
        output = str(result.final_output or "")
    except (MaxTurnsExceeded, ModelBehaviorError) as err:  # the model's failure: no answer, reward 0
        logger.info("no answer: %s", err)
        output = ""
    finally:
        await client.close()
    return reward(output, [task["answer"], *(task.get("answer_aliases") or [])], **weights)


def retriever_for(task: dict[str, Any], settings: dict[str, Any]) -> Any:
    """The shared retriever over `settings["corpus"]` (built once per process, embeddings cached on
    disk), or, with no corpus, one over the task's own MuSiQue `paragraphs` (in memory)."""
    method, model = settings["method"], settings["model"]
    if settings["corpus"] is None:
        passages = [
            Passage(str(p.get("idx", i)), str(p.get("title", "")), str(p["paragraph_text"]))
            for i, p in enumerate(task.get("paragraphs") or [])
        ]
        return make_retriever(passages, method=method, model=model, cache_dir=None)
    key = (settings["corpus"], method, model)
    if key not in _retrievers:
        cache_dir = settings["cache_dir"] or _default_cache_dir()
        _retrievers[key] = make_retriever(load_corpus(settings["corpus"]), method, model, cache_dir)
    return _retrievers[key]


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alight" / "rag_index"


# -- reward ----------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces (SQuAD's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall between the normalised texts."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def extract_answer(output: str) -> tuple[str, float]:
    """(the answer, the format score): the last `<answer>` tag's text, and 1.0 when the output has
    exactly one tag and it is not empty; without a tag the whole output is the answer, format 0."""
    tags = ANSWER_TAG.findall(output)
    if not tags:
        return output, 0.0
    return tags[-1], float(len(tags) == 1 and bool(tags[0].strip()))


def reward(output: str, answers: Sequence[str], format_weight: float = 0.1, f1_weight: float = 0.9) -> float:
    """format_weight * format score + f1_weight * the best token F1 against any of `answers`."""
    text, format_score = extract_answer(output)
    f1 = max((token_f1(text, gold) for gold in answers if gold), default=0.0)
    return format_weight * format_score + f1_weight * f1
