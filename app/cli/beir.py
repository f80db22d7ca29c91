"""BEIR-layout datasets (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).

Used by ``normcal fit``, ``normcal eval``, the benchmarks and the default-profile
script; the files themselves are read by :mod:`app.cli.inputs`. Embeddings of a corpus
are cached per model and dataset, so re-runs are fast.

Hybrid retrieval (:func:`hybrid_retrieve`) indexes the same texts with the product's own
lexical code (:mod:`app.collections.lexical`, an in-memory SQLite FTS5 index with the
Porter stemmer) and keeps, per query, the dense and BM25 lists and the cosine and BM25
of every member of the depth-``depth`` hybrid pool (:func:`calibration.fusion.candidate_pool`),
so any smaller pool (the calibration pairs) is a lookup.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.cli.inputs import Qrels, read_corpus
from app.collections import lexical
from app.embedding import Embedder, EmbeddingBatch
from app.embedding.precision import precision_of
from calibration.features import LEXICAL_DEPTH, LexicalEvidence
from calibration.fusion import HybridPool, hybrid_pool
from calibration.profile import QueryEvidence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedCorpus:
    """A corpus embedded by one model."""

    ids: list[str]
    vectors: NDArray[np.float32]
    norms: NDArray[np.float64]
    n_tokens: NDArray[np.int64]


def _corpus_key(embedder: Embedder, data_dir: Path) -> str:
    """The cache key of a corpus' embeddings: whatever decides them.

    The model's files (``model_id``: another model under the same configured name
    must not read this one's vectors), the precision it runs, and the corpus file
    (path, size, mtime).
    """
    corpus_file = data_dir / "corpus.jsonl"
    stat = corpus_file.stat()
    precision = precision_of(embedder).precision
    model = f"{embedder.model_name}|{embedder.model_id}|{precision}"
    return hashlib.sha256(
        f"{model}|{corpus_file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]


def corpus_is_cached(embedder: Embedder, data_dir: Path, cache_dir: Path) -> bool:
    """Whether :func:`embed_corpus` would read this corpus from ``cache_dir``."""
    return (
        cache_dir / f"{data_dir.name}-{_corpus_key(embedder, data_dir)}.npz"
    ).exists()


def embed_corpus(
    embedder: Embedder, data_dir: Path, cache_dir: Path | None = None
) -> EmbeddedCorpus:
    """Embed a corpus, reusing a cache keyed by :func:`_corpus_key`."""
    key = _corpus_key(embedder, data_dir)
    cache = None if cache_dir is None else cache_dir / f"{data_dir.name}-{key}.npz"
    if cache is not None and cache.exists():
        with np.load(cache, allow_pickle=False) as npz:
            return EmbeddedCorpus(
                [str(i) for i in npz["ids"]],
                npz["vectors"],
                npz["norms"],
                npz["n_tokens"],
            )
    docs = list(read_corpus(data_dir))
    logger.info("embedding %d documents of %s", len(docs), data_dir.name)
    batch = embedder.embed([d["text"] for d in docs], "document")
    out = EmbeddedCorpus(
        [d["id"] for d in docs], batch.vectors, batch.norms, batch.n_tokens
    )
    if cache is not None:
        save_npz(
            cache,
            ids=np.array(out.ids),
            vectors=out.vectors,
            norms=out.norms,
            n_tokens=out.n_tokens,
        )
    return out


def save_npz(path: Path, **arrays: Any) -> None:
    """Write ``arrays`` to ``path`` atomically (a temporary file, then a rename).

    Caches are shared between processes: a reader never sees half a file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Retrieval:
    """Top-``depth`` results of judged queries over an embedded corpus."""

    query_ids: list[str]
    doc_index: NDArray[np.int64]  # (n_queries, depth) rows of the corpus
    scores: NDArray[np.float32]  # (n_queries, depth)
    query_norms: NDArray[np.float64]
    query_tokens: NDArray[np.int64]

    def evidence(
        self, corpus: EmbeddedCorpus, qrels: Qrels, k: int
    ) -> list[QueryEvidence]:
        """Labelled top-``k`` evidence per query (relevance > 0 is relevant)."""
        out = []
        for i, qid in enumerate(self.query_ids):
            rows = self.doc_index[i, :k]
            judged = qrels.get(qid, {})
            out.append(
                QueryEvidence(
                    norm=float(self.query_norms[i]),
                    n_tokens=int(self.query_tokens[i]),
                    scores=self.scores[i, :k].astype(np.float64),
                    doc_norms=corpus.norms[rows],
                    doc_tokens=corpus.n_tokens[rows],
                    labels=np.array(
                        [float(judged.get(corpus.ids[r], 0) > 0) for r in rows]
                    ),
                )
            )
        return out


def retrieve(
    embedder: Embedder,
    corpus: EmbeddedCorpus,
    queries: dict[str, str],
    query_ids: list[str],
    depth: int,
) -> Retrieval:
    """Exact cosine top-``depth`` (FAISS flat inner product) for the given queries."""
    batch = embedder.embed([queries[q] for q in query_ids], "query")
    return _dense_search(corpus, query_ids, batch, depth)


def _dense_search(
    corpus: EmbeddedCorpus, query_ids: list[str], batch: EmbeddingBatch, depth: int
) -> Retrieval:
    from app.collections.index import VectorIndex

    index = VectorIndex(corpus.vectors.shape[1])
    index.add(np.arange(len(corpus.ids), dtype=np.int64), corpus.vectors)
    scores, rows = index.search(batch.vectors, depth)
    return Retrieval(query_ids, rows, scores, batch.norms, batch.n_tokens)


# -- hybrid retrieval (dense + BM25) -------------------------------------------------------
def lexical_index(
    data_dir: Path, ids: list[str] | None = None, stemmer: str = "porter"
) -> sqlite3.Connection:
    """In-memory FTS5 index of the corpus texts, ``seq`` = corpus row (as the service).

    Built with the product's own schema (``lexical.schema(stemmer)``) over exactly the
    texts that were embedded; ``ids`` (the embedded order), when given, must match
    the file.
    """
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE documents(seq INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    for statement in lexical.schema("none" if stemmer == "none" else "porter"):
        conn.execute(statement)
    docs = list(read_corpus(data_dir))
    if ids is not None and [d["id"] for d in docs] != ids:
        raise ValueError(f"{data_dir}: corpus changed since it was embedded")
    conn.executemany(
        "INSERT INTO documents(seq, text) VALUES (?, ?)",
        ((row, d["text"]) for row, d in enumerate(docs)),
    )
    conn.commit()
    return conn


@dataclass(frozen=True)
class HybridRetrieval:
    """Dense and BM25 lists of judged queries and their depth-``depth`` hybrid pools.

    Rows are corpus rows; ``-1`` pads. ``pool`` is
    ``candidate_pool(dense, lexical, depth)``; ``pool_cosine``/``pool_bm25`` hold every
    member's cosine and BM25 (0 for no query term), whichever list it came from.
    """

    query_ids: list[str]
    dense: NDArray[np.int64]  # (n_queries, depth)
    lexical: NDArray[np.int64]  # (n_queries, LEXICAL_DEPTH)
    pool: NDArray[np.int64]  # (n_queries, 2 * depth)
    pool_cosine: NDArray[np.float64]
    pool_bm25: NDArray[np.float64]
    idf_mass: NDArray[np.float64]
    lexical_top: NDArray[np.float64]
    query_norms: NDArray[np.float64]
    query_tokens: NDArray[np.int64]

    @property
    def depth(self) -> int:
        """Depth of the dense and BM25 lists the pools are built from."""
        return int(self.dense.shape[1])

    def lists(self, i: int) -> tuple[list[int], list[int]]:
        """Query ``i``'s dense and BM25 lists (corpus rows, best first)."""
        return (
            [int(r) for r in self.dense[i] if r >= 0],
            [int(r) for r in self.lexical[i] if r >= 0],
        )

    def hybrid_pool(self, i: int, n: int, *, hybrid: bool = True) -> HybridPool[int]:
        """Query ``i``'s hybrid pool of ``n`` (or only its dense members), as served."""
        dense, lex = self.lists(i)
        return hybrid_pool(dense, lex, n, kept=None if hybrid else set(dense[:n]))

    def members(self, i: int, n: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Rows of query ``i``'s hybrid pool of ``n``, and their slots in ``pool[i]``."""
        return self._rows_and_slots(i, self.hybrid_pool(i, n).members)

    def _rows_and_slots(
        self, i: int, rows: list[int]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        slot = {int(r): j for j, r in enumerate(self.pool[i]) if r >= 0}
        return np.array(rows, dtype=np.int64), np.array(
            [slot[r] for r in rows], dtype=np.int64
        )

    def evidence(
        self, corpus: EmbeddedCorpus, qrels: Qrels, n: int, *, hybrid: bool = True
    ) -> list[QueryEvidence]:
        """Labelled evidence per query: the hybrid pool of ``n`` (or the dense top ``n``).

        Every hit carries its BM25 evidence; relevance > 0 is relevant.
        """
        if n > self.depth:
            raise ValueError(f"pool of {n} asked from lists of depth {self.depth}")
        out = []
        for i, qid in enumerate(self.query_ids):
            shape = self.hybrid_pool(i, n, hybrid=hybrid)
            rows, slots = self._rows_and_slots(i, shape.members)
            judged = qrels.get(qid, {})
            out.append(
                QueryEvidence(
                    norm=float(self.query_norms[i]),
                    n_tokens=int(self.query_tokens[i]),
                    scores=self.pool_cosine[i, slots],
                    doc_norms=corpus.norms[rows],
                    doc_tokens=corpus.n_tokens[rows],
                    labels=np.array(
                        [float(judged.get(corpus.ids[r], 0) > 0) for r in rows]
                    ),
                    lexical=LexicalEvidence(
                        bm25=self.pool_bm25[i, slots],
                        rank=shape.lexical_rank,
                        idf_mass=float(self.idf_mass[i]),
                        top=float(self.lexical_top[i]),
                    ),
                )
            )
        return out


def hybrid_retrieve(
    embedder: Embedder,
    data_dir: Path,
    corpus: EmbeddedCorpus,
    queries: dict[str, str],
    query_ids: list[str],
    depth: int = LEXICAL_DEPTH,
    cache_dir: Path | None = None,
) -> HybridRetrieval:
    """Dense top-``depth``, BM25 top-``depth`` and their pool for the given queries.

    The result is cached next to the corpus embeddings (keyed by model, corpus file,
    the query ids and texts, and ``depth``): BM25 over every query is the slow part.
    """
    if depth > LEXICAL_DEPTH:
        raise ValueError(f"depth {depth} > LEXICAL_DEPTH {LEXICAL_DEPTH}")
    key = hashlib.sha256(
        "|".join(
            [
                _corpus_key(embedder, data_dir),
                str(depth),
                *(f"{q}\t{queries[q]}" for q in query_ids),
            ]
        ).encode()
    ).hexdigest()[:16]
    cache = (
        None if cache_dir is None else cache_dir / f"{data_dir.name}-hybrid-{key}.npz"
    )
    if cache is not None and cache.exists():
        with np.load(cache, allow_pickle=False) as z:
            return HybridRetrieval(
                query_ids=[str(q) for q in z["query_ids"]],
                **{f: z[f] for f in _HYBRID_ARRAYS},
            )
    out = _hybrid_retrieve(embedder, data_dir, corpus, queries, query_ids, depth)
    if cache is not None:
        save_npz(
            cache,
            query_ids=np.array(out.query_ids),
            **{f: getattr(out, f) for f in _HYBRID_ARRAYS},
        )
    return out


_HYBRID_ARRAYS = (
    "dense",
    "lexical",
    "pool",
    "pool_cosine",
    "pool_bm25",
    "idf_mass",
    "lexical_top",
    "query_norms",
    "query_tokens",
)


def _hybrid_retrieve(
    embedder: Embedder,
    data_dir: Path,
    corpus: EmbeddedCorpus,
    queries: dict[str, str],
    query_ids: list[str],
    depth: int,
) -> HybridRetrieval:
    depth = min(depth, len(corpus.ids))
    batch = embedder.embed([queries[q] for q in query_ids], "query")
    dense = _dense_search(corpus, query_ids, batch, depth)
    conn = lexical_index(data_dir, corpus.ids)
    nq = len(query_ids)
    lex = np.full((nq, LEXICAL_DEPTH), -1, dtype=np.int64)
    pool = np.full((nq, 2 * depth), -1, dtype=np.int64)
    cos = np.zeros((nq, 2 * depth))
    bm25 = np.zeros((nq, 2 * depth))
    idf, top = np.zeros(nq), np.zeros(nq)
    for i, qid in enumerate(query_ids):
        text = queries[qid]
        # Every match at once: the BM25 of any pool member is then a lookup
        # (as the service does, app.collections.registry).
        hits = lexical.search(conn, text, len(corpus.ids))
        lex[i, : min(len(hits.seqs), LEXICAL_DEPTH)] = hits.seqs[:LEXICAL_DEPTH]
        idf[i] = lexical.idf_mass(conn, text)
        top[i] = float(hits.scores[0]) if len(hits.scores) else 0.0
        rows = hybrid_pool(
            [int(r) for r in dense.doc_index[i] if r >= 0],
            [int(r) for r in hits.seqs[:LEXICAL_DEPTH]],
            depth,
        ).members
        score_of = dict(zip(hits.seqs.tolist(), hits.scores.tolist(), strict=True))
        pool[i, : len(rows)] = rows
        cos[i, : len(rows)] = corpus.vectors[rows] @ batch.vectors[i]
        bm25[i, : len(rows)] = [score_of.get(r, 0.0) for r in rows]
    conn.close()
    return HybridRetrieval(
        query_ids=list(query_ids),
        dense=dense.doc_index.astype(np.int64),
        lexical=lex,
        pool=pool,
        pool_cosine=cos,
        pool_bm25=bm25,
        idf_mass=idf,
        lexical_top=top,
        query_norms=dense.query_norms,
        query_tokens=dense.query_tokens,
    )
