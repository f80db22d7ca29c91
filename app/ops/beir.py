"""BEIR-layout datasets (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).

Used by ``normcal ingest``, ``normcal fit``, ``normcal eval`` and the default-profile
script. Embeddings of a corpus are cached per model and dataset, so re-runs are fast.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.embedding import Embedder
from calibration.profile import QueryEvidence

logger = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]


def read_corpus(data_dir: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield ``{"id", "text", "metadata"}`` from a BEIR ``corpus.jsonl``.

    The title, when present, is the first line of the text (BEIR's convention of
    embedding title and body together).
    """
    with (data_dir / "corpus.jsonl").open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if limit is not None and n >= limit:
                return
            row = json.loads(line)
            title = (row.get("title") or "").strip()
            body = (row.get("text") or "").strip()
            text = f"{title}\n{body}" if title and body else (title or body)
            if text:
                yield {"id": str(row["_id"]), "text": text, "metadata": {}}


def read_queries(data_dir: Path) -> dict[str, str]:
    """Query id -> text."""
    out: dict[str, str] = {}
    with (data_dir / "queries.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out[str(row["_id"])] = str(row["text"])
    return out


def read_qrels(data_dir: Path, split: str) -> Qrels:
    """Query id -> {document id: graded relevance} (``0`` rows kept as judged)."""
    path = data_dir / "qrels" / f"{split}.tsv"
    out: Qrels = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            out.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(
                row["score"]
            )
    return out


@dataclass(frozen=True)
class EmbeddedCorpus:
    """A corpus embedded by one model."""

    ids: list[str]
    vectors: NDArray[np.float32]
    norms: NDArray[np.float64]
    n_tokens: NDArray[np.int64]


def embed_corpus(
    embedder: Embedder, data_dir: Path, cache_dir: Path | None = None
) -> EmbeddedCorpus:
    """Embed a corpus, reusing a cache keyed by model, file size and mtime."""
    corpus_file = data_dir / "corpus.jsonl"
    stat = corpus_file.stat()
    key = hashlib.sha256(
        f"{embedder.model_name}|{corpus_file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
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
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            cache,
            ids=np.array(out.ids),
            vectors=out.vectors,
            norms=out.norms,
            n_tokens=out.n_tokens,
        )
    return out


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
    from app.collections.index import VectorIndex

    index = VectorIndex(corpus.vectors.shape[1])
    index.add(np.arange(len(corpus.ids), dtype=np.int64), corpus.vectors)
    batch = embedder.embed([queries[q] for q in query_ids], "query")
    scores, rows = index.search(batch.vectors, depth)
    return Retrieval(query_ids, rows, scores, batch.norms, batch.n_tokens)
