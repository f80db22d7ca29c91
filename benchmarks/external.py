"""Candidate lists of other retrievers (issue 34): simulated retrievers and their lists.

``POST /v1/rerank`` calibrates lists that normcal did not retrieve. Its shipped
default (``scripts/fit_rerank_profile.py``) and the tables that validate it
(``benchmarks/external_transfer.py``) are built from the lists made here: every
shared relevance set (``benchmarks.transfer.SETS``, test qrels, at most
:data:`MAX_QUERIES` judged queries per set, a fixed random sample) retrieved by six
simulated retrievers of varying quality, each list :data:`DEPTH` long:

``bm25``
    BM25 over the corpus (the product's FTS5 index, Porter stemmer), its BM25 scores.
``minilm``, ``l3``
    Dense top-k of all-MiniLM-L6-v2 (the served model) and paraphrase-MiniLM-L3-v2
    over the whole corpus, their cosines.
``mpnet``
    all-mpnet-base-v2 ordering the union of the BM25, MiniLM and L3 top
    :data:`UNION_DEPTH` by its cosine over each passage's first :data:`MPNET_CHARS`
    characters: a strong second stage over a hybrid candidate set. (mpnet costs
    about 2 CPU-seconds per 300-token passage on the shared 2-core machine this was
    built on: whole corpora were not affordable.)
``rrf``
    Reciprocal-rank fusion (k = 60) of the mpnet and BM25 lists over that union.
``lead``
    The deliberately weak one: BM25 over each document's first :data:`LEAD_WORDS`
    words only (about a title), its BM25 scores.

Each list becomes the features the service computes for a rerank request
(``app.services.rerank.score_list``): normcal's (MiniLM) cosine, norms and lengths,
BM25 among the candidates themselves (``app.collections.lexical.list_evidence``),
the list's own order and score gaps. Beside them, the same BM25 columns with
document frequencies from a *background* table (the other sets' corpora: never the
set's own), to measure which lexical evidence transfers.

Corpus embeddings come from ``app.cli.beir`` (shared cache ``~/.cache/normcal/corpus``);
everything else is cached under ``~/.cache/normcal/external`` (atomic writes).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pickle
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.cli.beir import (
    EmbeddedCorpus,
    HybridRetrieval,
    embed_corpus,
    hybrid_retrieve,
    save_npz,
)
from app.cli.inputs import read_corpus, read_qrels, read_queries
from app.collections import lexical
from app.collections.postings import K1, B, Tokenizer
from calibration.features import LEXICAL_DEPTH, LexicalEvidence
from calibration.profile import QueryEvidence

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

RETRIEVERS = ("bm25", "minilm", "l3", "mpnet", "rrf", "lead")
DEPTH = 20
MAX_QUERIES = 50
UNION_DEPTH = 10
MPNET_CHARS = 500
LEAD_WORDS = 10
RRF_K = 60
VERSION = "1"  # bump to rebuild the caches below
EXTERNAL_CACHE = Path.home() / ".cache" / "normcal" / "external"


def _key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, (VERSION, *parts))).encode()).hexdigest()[
        :16
    ]


def sampled_queries(
    data_dir: Path,
) -> tuple[list[str], list[str], dict[str, dict[str, int]]]:
    """All judged query ids (the hybrid cache's key), the sample used, the qrels."""
    queries = read_queries(data_dir)
    qrels = read_qrels(data_dir, "test")
    qids = sorted(q for q in qrels if q in queries)
    rng = np.random.default_rng(0)
    pick = qids
    if len(qids) > MAX_QUERIES:
        pick = sorted(rng.choice(qids, size=MAX_QUERIES, replace=False).tolist())
    return qids, pick, qrels


@dataclass(frozen=True)
class SetLists:
    """The lists of one set: per retriever, corpus rows and scores, best first."""

    name: str
    qids: list[str]
    rows: dict[str, IntArray]  # retriever -> (n_queries, DEPTH), -1 pads
    scores: dict[str, FloatArray]


def _hybrid(
    embedder: Any, data_dir: Path, cache: Path
) -> tuple[EmbeddedCorpus, HybridRetrieval]:
    corpus = embed_corpus(embedder, data_dir, cache)
    qids, _, _ = sampled_queries(data_dir)
    queries = read_queries(data_dir)
    depth = min(LEXICAL_DEPTH, len(corpus.ids))
    return corpus, hybrid_retrieve(
        embedder, data_dir, corpus, queries, qids, depth, cache
    )


def _top(
    rows: Sequence[int], scores: Sequence[float], n: int = DEPTH
) -> tuple[IntArray, FloatArray]:
    r = np.full(n, -1, dtype=np.int64)
    s = np.zeros(n)
    k = min(n, len(rows))
    r[:k] = rows[:k]
    s[:k] = scores[:k]
    return r, s


def _lead_index(data_dir: Path, ids: list[str]) -> sqlite3.Connection:
    """An FTS5 index of each document's first :data:`LEAD_WORDS` words (``seq`` = row)."""
    conn = lexical.list_index("porter")
    docs = list(read_corpus(data_dir))
    if [d["id"] for d in docs] != ids:
        raise ValueError(f"{data_dir}: corpus changed since it was embedded")
    conn.executemany(
        "INSERT INTO documents(seq, text) VALUES (?, ?)",
        ((row, " ".join(d["text"].split()[:LEAD_WORDS])) for row, d in enumerate(docs)),
    )
    return conn


def set_lists(
    name: str, embedders: dict[str, Any], data: Path, cache: Path, *, mpnet: str
) -> tuple[SetLists, EmbeddedCorpus]:
    """Every retriever's lists of one set, and its MiniLM corpus.

    ``mpnet``: ``"embed"`` embeds what the mpnet lists need when it is not cached,
    ``"cached"`` leaves the ``mpnet`` and ``rrf`` lists out unless it is.
    """
    data_dir = data / name
    corpus, minilm = _hybrid(embedders["minilm"], data_dir, cache)
    qids, pick, _ = sampled_queries(data_dir)
    base = ("bm25", "minilm", "l3", "lead")
    key = _key(name, len(corpus.ids), ",".join(pick), UNION_DEPTH)
    path = EXTERNAL_CACHE / f"{name}-lists-{key}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            rows = {r: z[f"rows_{r}"] for r in base}
            scores = {r: z[f"scores_{r}"] for r in base}
            unions = [u[u >= 0] for u in z["unions"]]
    else:
        rows, scores, unions = _base_lists(embedders, data_dir, cache, corpus, minilm)
        width = max(len(u) for u in unions)
        padded = np.full((len(unions), width), -1, dtype=np.int64)
        for i, u in enumerate(unions):
            padded[i, : len(u)] = u
        save_npz(
            path,
            unions=padded,
            **{f"rows_{r}": rows[r] for r in base},
            **{f"scores_{r}": scores[r] for r in base},
        )
    vectors = _mpnet(name, embedders, data_dir, corpus, pick, unions, mpnet)
    if vectors is not None:
        at = {q: i for i, q in enumerate(qids)}
        bm25_lists = [minilm.lists(at[q])[1] for q in pick]
        for retriever, made in _mpnet_lists(vectors, unions, bm25_lists).items():
            rows[retriever], scores[retriever] = made
    return SetLists(name, pick, rows, scores), corpus


def _base_lists(
    embedders: dict[str, Any],
    data_dir: Path,
    cache: Path,
    corpus: EmbeddedCorpus,
    minilm: HybridRetrieval,
) -> tuple[dict[str, IntArray], dict[str, FloatArray], list[IntArray]]:
    """The BM25, MiniLM, L3 and lead lists, and each query's mpnet union."""
    qids, pick, _ = sampled_queries(data_dir)
    _, l3 = _hybrid(embedders["l3"], data_dir, cache)
    queries = read_queries(data_dir)
    at = {q: i for i, q in enumerate(qids)}
    lead = _lead_index(data_dir, corpus.ids)
    rows: dict[str, list[IntArray]] = {r: [] for r in ("bm25", "minilm", "l3", "lead")}
    scores: dict[str, list[FloatArray]] = {r: [] for r in rows}
    unions: list[IntArray] = []
    for qid in pick:
        i = at[qid]
        dense, bm25 = minilm.lists(i)
        slot = {int(r): j for j, r in enumerate(minilm.pool[i]) if r >= 0}
        l3_dense, _ = l3.lists(i)
        l3_slot = {int(r): j for j, r in enumerate(l3.pool[i]) if r >= 0}
        hits = lexical.search(lead, queries[qid], DEPTH)
        made = {
            "bm25": _top(bm25, [float(minilm.pool_bm25[i, slot[r]]) for r in bm25]),
            "minilm": _top(
                dense, [float(minilm.pool_cosine[i, slot[r]]) for r in dense]
            ),
            "l3": _top(
                l3_dense, [float(l3.pool_cosine[i, l3_slot[r]]) for r in l3_dense]
            ),
            "lead": _top(hits.seqs.tolist(), hits.scores.tolist()),
        }
        for retriever, (r, s) in made.items():
            rows[retriever].append(r)
            scores[retriever].append(s)
        union = dict.fromkeys(
            [*dense[:UNION_DEPTH], *bm25[:UNION_DEPTH], *l3_dense[:UNION_DEPTH]]
        )
        unions.append(np.array(list(union), dtype=np.int64))
    lead.close()
    return (
        {r: np.vstack(v) for r, v in rows.items()},
        {r: np.vstack(v) for r, v in scores.items()},
        unions,
    )


def _mpnet_lists(
    vectors: tuple[NDArray[np.float32], NDArray[np.float32]],
    unions: list[IntArray],
    bm25_lists: list[list[int]],
) -> dict[str, tuple[IntArray, FloatArray]]:
    """mpnet's order of each union, and its RRF with the BM25 list (k = 60)."""
    docs, qvec = vectors
    made: dict[str, tuple[list[IntArray], list[FloatArray]]] = {
        "mpnet": ([], []),
        "rrf": ([], []),
    }
    for n, (union, bm25) in enumerate(zip(unions, bm25_lists, strict=True)):
        cos = docs[union] @ qvec[n]
        order = np.argsort(-cos, kind="stable")
        ranked_mpnet = union[order].tolist()
        r, s = _top(ranked_mpnet, cos[order].tolist())
        made["mpnet"][0].append(r)
        made["mpnet"][1].append(s)
        # Each member's true BM25 rank (the BM25 list runs to depth 100).
        bm25_rank = {x: rank for rank, x in enumerate(bm25, start=1)}
        fused = {
            x: 1.0 / (RRF_K + rank)
            + (1.0 / (RRF_K + bm25_rank[x]) if x in bm25_rank else 0.0)
            for rank, x in enumerate(ranked_mpnet, start=1)
        }
        ranked = sorted(fused, key=lambda x: -fused[x])  # stable: mpnet order on ties
        r, s = _top(ranked, [fused[x] for x in ranked])
        made["rrf"][0].append(r)
        made["rrf"][1].append(s)
    return {k: (np.vstack(r), np.vstack(s)) for k, (r, s) in made.items()}


def _mpnet(
    name: str,
    embedders: dict[str, Any],
    data_dir: Path,
    corpus: EmbeddedCorpus,
    pick: list[str],
    unions: list[IntArray],
    mode: str,
) -> tuple[NDArray[np.float32], NDArray[np.float32]] | None:
    """mpnet vectors of every union member (by corpus row) and of the queries.

    Cached; ``mode`` ``"cached"``: None when they are not.
    """
    needed = np.unique(np.concatenate(unions))
    key = _key(name, len(corpus.ids), ",".join(pick), needed.tolist(), MPNET_CHARS)
    path = EXTERNAL_CACHE / f"{name}-mpnet-{key}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            rows, docs, qvec = z["rows"], z["docs"], z["queries"]
    elif mode == "cached":
        return None
    else:
        texts = {i: d["text"] for i, d in enumerate(read_corpus(data_dir))}
        queries = read_queries(data_dir)
        embedder = embedders["mpnet"]()  # loaded once, on first use
        docs = embedder.embed(
            [texts[int(r)][:MPNET_CHARS] for r in needed], "document"
        ).vectors
        qvec = embedder.embed([queries[q] for q in pick], "query").vectors
        rows = needed
        save_npz(path, rows=rows, docs=docs, queries=qvec)
    full = np.zeros((len(corpus.ids), docs.shape[1]), dtype=np.float32)
    full[rows] = docs
    return full, qvec


# -- features --------------------------------------------------------------------------
@dataclass(frozen=True)
class ListSet:
    """One (set, retriever) domain: its lists as the service would see them.

    ``evidence`` per query (rows in the retriever's order, labels relevance > 0);
    ``gains`` the graded relevance of each row; ``ideal`` each query's judged
    relevances (the ideal DCG); ``raw`` the retriever's raw scores per row;
    ``background`` the BM25 columns from the background table, per row;
    ``queries`` each list's query (its position in the set's sample), the same
    query under every retriever.
    """

    name: str
    retriever: str
    evidence: list[QueryEvidence]
    gains: list[FloatArray]
    ideal: list[FloatArray]
    background: list[LexicalEvidence]
    queries: list[int]


def _tokens_bm25(
    query_tokens: list[str],
    doc_tf: list[dict[str, int]],
    lengths: FloatArray,
    df: dict[str, int],
    n_docs: int,
) -> tuple[FloatArray, float]:
    """FTS5's BM25 (``app.collections.postings``' formula) with given frequencies."""
    avgdl = float(lengths.mean()) if lengths.size and lengths.mean() > 0 else 1.0
    scores = np.zeros(len(doc_tf))
    mass = 0.0
    for term in query_tokens:
        n = df.get(term, 0)
        idf = max(math.log((n_docs - n + 0.5) / (n + 0.5)), 1e-6)
        mass += idf
        for j, tf in enumerate(doc_tf):
            f = tf.get(term, 0)
            if f:
                scores[j] += (
                    idf * (f * (K1 + 1.0)) / (f + K1 * (1 - B + B * lengths[j] / avgdl))
                )
    return scores, mass


def background_df(
    names: Sequence[str], data: Path
) -> dict[str, tuple[dict[str, int], int]]:
    """Per set: document frequencies of every term in its corpus, and its size."""
    out = {}
    for name in names:
        path = (
            EXTERNAL_CACHE
            / f"{name}-df-{_key(name, (data / name / 'corpus.jsonl').stat().st_size)}.json"
        )
        if path.exists():
            loaded = json.loads(path.read_text())
            out[name] = (loaded["df"], int(loaded["n"]))
            continue
        texts = [d["text"] for d in read_corpus(data / name)]
        tokens = Tokenizer("porter").texts(texts)
        df = {
            t: int(tokens.bounds[i + 1] - tokens.bounds[i])
            for i, t in enumerate(tokens.terms)
        }
        out[name] = (df, len(texts))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"df": df, "n": len(texts)}, ensure_ascii=False))
        tmp.replace(path)
    return out


def list_sets(
    lists: SetLists,
    corpus: EmbeddedCorpus,
    minilm: Any,
    data: Path,
    background: tuple[dict[str, int], int],
) -> dict[str, ListSet]:
    """Each retriever's lists of one set as the service's features (cached)."""
    data_dir = data / lists.name
    queries = read_queries(data_dir)
    _, _, qrels = sampled_queries(data_dir)
    df, n_bg = background
    key = _key(lists.name, len(corpus.ids), ",".join(lists.qids), "queries")
    qvec = _query_batch(lists.name, minilm, [queries[q] for q in lists.qids], key)
    # The background's size and vocabulary name it (it depends on the other sets).
    features = _key(key, "features", n_bg, len(df))
    path = EXTERNAL_CACHE / f"{lists.name}-features-{features}.npz"
    texts = {i: d["text"] for i, d in enumerate(read_corpus(data_dir))}
    cached = None
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            cached = {k: z[k] for k in z.files}
    out: dict[str, ListSet] = {}
    store: dict[str, Any] = {}
    conn = lexical.list_index("porter")
    tokenizer = Tokenizer("porter")
    for retriever in [r for r in RETRIEVERS if r in lists.rows]:
        evidence, gains, ideal, bgs, asked = [], [], [], [], []
        for i, qid in enumerate(lists.qids):
            rows = lists.rows[retriever][i]
            keep = rows >= 0
            rows = rows[keep]
            raw = lists.scores[retriever][i][keep]
            if rows.size == 0:
                continue
            judged = qrels.get(qid, {})
            grade = np.array([float(judged.get(corpus.ids[r], 0)) for r in rows])
            tag = f"{retriever}_{i}"
            if cached is not None and f"bm25_{tag}" in cached:
                lex = LexicalEvidence(
                    bm25=cached[f"bm25_{tag}"],
                    rank=cached[f"rank_{tag}"],
                    idf_mass=float(cached[f"mass_{tag}"][0]),
                    top=float(cached[f"mass_{tag}"][1]),
                )
                bg = LexicalEvidence(
                    bm25=cached[f"bgbm25_{tag}"],
                    rank=cached[f"bgrank_{tag}"],
                    idf_mass=float(cached[f"bgmass_{tag}"][0]),
                    top=float(cached[f"bgmass_{tag}"][1]),
                )
            else:
                docs = [texts[int(r)] for r in rows]
                lex = lexical.list_evidence(conn, queries[qid], docs)
                bg = _background_evidence(tokenizer, queries[qid], docs, df, n_bg)
                for prefix, e in (("", lex), ("bg", bg)):
                    store[f"{prefix}bm25_{tag}"] = e.bm25
                    store[f"{prefix}rank_{tag}"] = e.rank
                    store[f"{prefix}mass_{tag}"] = np.array([e.idf_mass, e.top])
            evidence.append(
                QueryEvidence(
                    norm=float(qvec.norms[i]),
                    n_tokens=int(qvec.n_tokens[i]),
                    scores=(corpus.vectors[rows] @ qvec.vectors[i]).astype(np.float64),
                    doc_norms=corpus.norms[rows],
                    doc_tokens=corpus.n_tokens[rows],
                    labels=(grade > 0).astype(np.float64),
                    lexical=lex,
                    input_scores=raw.astype(np.float64),
                )
            )
            gains.append(grade)
            asked.append(i)
            ideal.append(np.array([float(g) for g in judged.values()]))
            bgs.append(bg)
        out[retriever] = ListSet(
            lists.name, retriever, evidence, gains, ideal, bgs, asked
        )
    conn.close()
    if store:  # what was computed now joins what was cached
        save_npz(path, **(cached or {}), **store)
    return out


def _background_evidence(
    tokenizer: Tokenizer, query: str, docs: list[str], df: dict[str, int], n_docs: int
) -> LexicalEvidence:
    tokens = tokenizer.texts(docs)
    doc_tf: list[dict[str, int]] = [{} for _ in docs]
    for t, term in enumerate(tokens.terms):
        seqs, tf = tokens.posting(t)
        for s, f in zip(seqs.tolist(), tf.tolist(), strict=True):
            doc_tf[s][term] = f
    terms = [
        tok for toks in tokenizer.terms(lexical.query_terms(query)) for tok in toks
    ]
    bm25, mass = _tokens_bm25(
        terms, doc_tf, tokens.lengths.astype(np.float64), df, n_docs
    )
    order = np.argsort(-bm25, kind="stable")
    rank = np.full(len(docs), float(LEXICAL_DEPTH + 1))
    matched = order[bm25[order] > 0]
    rank[matched] = np.arange(1, matched.size + 1)
    return LexicalEvidence(bm25=bm25, rank=rank, idf_mass=mass, top=float(bm25.max()))


@dataclass(frozen=True)
class _Queries:
    vectors: NDArray[np.float32]
    norms: FloatArray
    n_tokens: IntArray


def _query_batch(name: str, minilm: Any, texts: list[str], key: str) -> _Queries:
    path = EXTERNAL_CACHE / f"{name}-queries-{key}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            return _Queries(z["vectors"], z["norms"], z["n_tokens"])
    batch = minilm.embed(texts, "query")
    save_npz(path, vectors=batch.vectors, norms=batch.norms, n_tokens=batch.n_tokens)
    return _Queries(batch.vectors, batch.norms, batch.n_tokens)


def load_all(
    names: Sequence[str], data: Path, cache: Path, *, mpnet: str = "embed"
) -> dict[tuple[str, str], ListSet]:
    """Every (set, retriever) domain of ``names`` (embedding what is missing).

    ``mpnet="cached"``: the mpnet and RRF domains of the sets whose mpnet vectors are
    cached only (see :func:`set_lists`). The result is kept whole
    (``~/.cache/normcal/external/lists-*.pkl``, keyed by the sets, ``mpnet`` and
    :data:`VERSION`): the corpus caches under it are keyed by the data files' mtime,
    and a re-staged copy of the same data would otherwise embed every corpus again.
    Delete it when the data itself changes.
    """
    whole = EXTERNAL_CACHE / f"lists-{_key(','.join(names), mpnet)}.pkl"
    if whole.exists():
        with whole.open("rb") as fh:
            kept: dict[tuple[str, str], ListSet] = pickle.load(fh)
        return kept
    out = _load_all(names, data, cache, mpnet=mpnet)
    whole.parent.mkdir(parents=True, exist_ok=True)
    tmp = whole.with_name(f".{whole.name}.{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(out))
    os.replace(tmp, whole)
    return out


def _load_all(
    names: Sequence[str], data: Path, cache: Path, *, mpnet: str
) -> dict[tuple[str, str], ListSet]:
    from app.api.lifespan import load_embedder
    from app.settings import Settings
    from benchmarks.models import all_mpnet_base_v2, paraphrase_minilm_l3

    minilm = load_embedder(Settings())
    embedders: dict[str, Any] = {
        "minilm": minilm,
        "l3": paraphrase_minilm_l3(),
        "mpnet": functools.cache(all_mpnet_base_v2),  # loaded when a set needs it
    }
    frequencies = background_df(names, data)
    out: dict[tuple[str, str], ListSet] = {}
    for name in names:
        print(f"lists: {name}", file=sys.stderr, flush=True)
        lists, corpus = set_lists(name, embedders, data, cache, mpnet=mpnet)
        df: dict[str, int] = {}
        n_bg = 0
        for other, (counts, n) in frequencies.items():
            if other == name:
                continue
            n_bg += n
            for term, c in counts.items():
                df[term] = df.get(term, 0) + c
        for retriever, domain in list_sets(
            lists, corpus, minilm, data, (df, n_bg)
        ).items():
            out[(name, retriever)] = domain
    return out


if __name__ == "__main__":
    from benchmarks.eval_all import CACHE, DATA
    from benchmarks.transfer import SETS

    names = sys.argv[1:] or list(SETS)
    domains = load_all(names, DATA, CACHE)  # embeds every missing piece
    for (name, retriever), d in domains.items():
        y = np.concatenate([e.labels for e in d.evidence if e.labels is not None])
        print(name, retriever, len(d.evidence), f"base rate {y.mean():.3f}")
