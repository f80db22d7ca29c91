"""``normcal eval DATA_DIR --collection C``: evaluate what a server serves, over HTTP.

Nothing is embedded here. For each judged query of the dataset the server retrieves
its dense and its BM25 top-``depth`` (two batch searches per batch of queries,
``candidates`` = ``depth``), and answers every hit's cosine, BM25, norm and token
count and the query's norm and token count: the lists :mod:`app.cli.evaluation`
scores, exactly as it scores the ones ``normcal eval`` makes locally. What a search
answer lacks is each query's IDF mass (the scale of the BM25 features); it is read
from the dataset's ``corpus.jsonl`` with the product's own lexical index, which is
the collection's when the collection was ingested from that corpus.

Two checks say whether the lists are the dataset's: the judged documents must be in
the collection (none there: an error naming both sides' ids; some missing: a note),
and the calibrator the collection serves, exported and scored here on these lists,
must reproduce the probabilities the server answered (``reproduced``: the largest
difference; a large one means the collection's lexical statistics are not the
corpus's, say because it holds other documents too).
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.cli.beir import EmbeddedCorpus, HybridRetrieval, lexical_index
from app.cli.evaluation import (
    Retrieved,
    eval_depth,
    evaluate_retrieved,
    judged_ids,
    read_splits,
)
from app.cli.inputs import Qrels
from app.collections import lexical
from calibration.evaluation import EvalOptions
from calibration.features import LEXICAL_DEPTH
from calibration.fusion import hybrid_pool
from calibration.profile import Profile

if TYPE_CHECKING:
    from normcal_client import NormcalClient, SearchResult

QUERIES_PER_SEARCH = 16  # within the server's default max_queries_per_search (32)
DOC_SAMPLE = 5000  # documents read for the document-side norm reference
REPRODUCED = 1e-6  # largest |p_server - p_here| of lists that are the server's


class ServedEvalError(Exception):
    """The collection cannot be evaluated with this dataset (the message says why)."""


@dataclass(frozen=True)
class _Answer:
    """One query's two served lists."""

    norm: float
    n_tokens: int
    dense: list[Any]  # SearchHit, best first
    lexical: list[Any]


def run_served_eval(
    client: NormcalClient,
    collection: str,
    data_dir: Path,
    *,
    split: str,
    fit_split: str | None = None,
    options: EvalOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``normcal eval``'s tables for a served collection (see the module docstring).

    Raises
    ------
    ServedEvalError
        The collection is empty, takes its clients' own vectors, or holds none of
        the documents the dataset's qrels judge.
    """
    opts = options or EvalOptions()
    say = progress or (lambda _msg: None)
    info = client.get_collection(collection)
    if info.embedding == "client":
        raise ServedEvalError(
            f"collection {collection!r} takes its clients' own vectors: the server "
            "cannot embed the dataset's queries for it"
        )
    n_documents = int(info.documents or 0)
    if n_documents == 0:
        raise ServedEvalError(f"collection {collection!r} holds no documents")
    queries, qrels, fit_qrels = read_splits(data_dir, split, fit_split)
    qids, fit_ids = judged_ids(queries, qrels, fit_qrels)
    missing = _missing_documents(client, collection, data_dir, qrels, fit_qrels)
    if missing:
        say(
            f"note: {len(missing)} judged documents are not in collection "
            f"{collection!r} (e.g. {missing[0]!r}): they count as relevant documents "
            "that are never retrieved"
        )
    depth = eval_depth(opts, n_documents)
    texts = [queries[q] for q in qids + fit_ids]
    say(f"served dense and BM25 top-{depth} of {len(texts)} judged queries")
    answers = _answers(client, collection, texts, depth)
    corpus, rows = _corpus(answers)
    with _lexical(data_dir, str(info.stemmer or "porter")) as conn:
        masses = [lexical.idf_mass(conn, text) for text in texts]
    n = len(qids)
    hybrid = _hybrid(qids, answers[:n], rows, masses[:n], depth)
    fit_hybrid = None
    if fit_split is not None:
        fit_hybrid = _hybrid(fit_ids, answers[n:], rows, masses[n:], depth)
    say(f"reading up to {DOC_SAMPLE} documents' norms for the document reference")
    sample = list(
        itertools.islice(client.iter_documents(collection, page_size=1000), DOC_SAMPLE)
    )
    retrieved = Retrieved(
        corpus,
        hybrid,
        fit_hybrid,
        np.array([d.norm for d in sample], dtype=np.float64),
        np.array([d.n_tokens for d in sample], dtype=np.int64),
    )
    served, default = _profiles(client, collection, info.calibrator)
    result = evaluate_retrieved(
        retrieved,
        qrels,
        fit_qrels,
        opts,
        split=split,
        fit_split=fit_split,
        progress=say,
        default_profile=default,
        served=served,
    )
    if served is not None:
        result["served"]["reproduced"] = _reproduced(
            served, hybrid, corpus, answers[:n], qrels
        )
    return {
        "dataset": data_dir.name,
        "model": info.model,
        "collection": collection,
        **result,
        "n_documents": n_documents,
        "missing_documents": len(missing),
    }


def _missing_documents(
    client: NormcalClient,
    collection: str,
    data_dir: Path,
    qrels: Qrels,
    fit_qrels: Qrels,
) -> list[str]:
    """Judged documents the collection lacks; an error when it has none of them."""
    judged = sorted({d for q in (qrels, fit_qrels) for row in q.values() for d in row})
    found = {d.id for d in client.get_documents(collection, judged)}
    missing = [d for d in judged if d not in found]
    if judged and len(missing) == len(judged):
        theirs = [d.id for d in client.list_documents(collection, limit=3).data]
        raise ServedEvalError(
            f"none of the {len(judged)} documents judged in {data_dir}'s qrels is in "
            f"collection {collection!r}: the qrels name {_ids(judged)}, the "
            f"collection holds {_ids(theirs)}. Evaluate the collection that was "
            f"ingested from this dataset (normcal ingest {data_dir} --collection "
            "NAME keeps the ids of its corpus.jsonl)"
        )
    return missing


def _ids(ids: Sequence[str]) -> str:
    return ", ".join(repr(i) for i in ids[:3]) + (", …" if len(ids) > 3 else "")


def _answers(
    client: NormcalClient, collection: str, texts: list[str], depth: int
) -> list[_Answer]:
    """Each query's served dense and BM25 top-``depth``, over the same pool."""
    out = []
    for start in range(0, len(texts), QUERIES_PER_SEARCH):
        batch = texts[start : start + QUERIES_PER_SEARCH]
        lists: list[list[SearchResult]] = [
            client.search_batch(collection, batch, k=depth, candidates=depth, mode=mode)
            for mode in ("dense", "lexical")
        ]
        out += [
            _Answer(d.query.norm, d.query.n_tokens, d.hits, lex.hits)
            for d, lex in zip(*lists, strict=True)
        ]
    return out


def _corpus(answers: Sequence[_Answer]) -> tuple[EmbeddedCorpus, dict[str, int]]:
    """Every document the lists name, with its norm and token count, and its row.

    The vectors stay on the server (``vectors`` has no columns).
    """
    rows: dict[str, int] = {}
    norms, tokens = [], []
    for answer in answers:
        for hit in (*answer.dense, *answer.lexical):
            if hit.id not in rows:
                rows[hit.id] = len(rows)
                norms.append(hit.norm)
                tokens.append(hit.n_tokens)
    corpus = EmbeddedCorpus(
        list(rows),
        np.zeros((len(rows), 0), dtype=np.float32),
        np.array(norms, dtype=np.float64),
        np.array(tokens, dtype=np.int64),
    )
    return corpus, rows


def _hybrid(
    query_ids: list[str],
    answers: Sequence[_Answer],
    rows: dict[str, int],
    masses: Sequence[float],
    depth: int,
) -> HybridRetrieval:
    """The served lists as :class:`~app.cli.beir.HybridRetrieval` (rows of ``rows``)."""
    nq = len(answers)
    dense = np.full((nq, depth), -1, dtype=np.int64)
    lex = np.full((nq, LEXICAL_DEPTH), -1, dtype=np.int64)
    pool = np.full((nq, 2 * depth), -1, dtype=np.int64)
    cos, bm25 = np.zeros((nq, 2 * depth)), np.zeros((nq, 2 * depth))
    for i, answer in enumerate(answers):
        d = [rows[h.id] for h in answer.dense[:depth]]
        lx = [rows[h.id] for h in answer.lexical[:LEXICAL_DEPTH]]
        dense[i, : len(d)], lex[i, : len(lx)] = d, lx
        members = hybrid_pool(d, lx, depth).members
        seen = {rows[h.id]: h for h in (*answer.lexical, *answer.dense)}
        pool[i, : len(members)] = members
        cos[i, : len(members)] = [seen[r].score for r in members]
        bm25[i, : len(members)] = [seen[r].bm25 for r in members]
    return HybridRetrieval(
        query_ids=list(query_ids),
        dense=dense,
        lexical=lex,
        pool=pool,
        pool_cosine=cos,
        pool_bm25=bm25,
        idf_mass=np.array(masses, dtype=np.float64),
        lexical_top=np.array(
            [a.lexical[0].bm25 if a.lexical else 0.0 for a in answers]
        ),
        query_norms=np.array([a.norm for a in answers], dtype=np.float64),
        query_tokens=np.array([a.n_tokens for a in answers], dtype=np.int64),
    )


@contextmanager
def _lexical(data_dir: Path, stemmer: str) -> Iterator[sqlite3.Connection]:
    """The dataset corpus's lexical index (the collection's, if it holds the corpus)."""
    conn = lexical_index(data_dir, stemmer=stemmer)
    try:
        yield conn
    finally:
        conn.close()


def _profiles(
    client: NormcalClient, collection: str, ref: Any
) -> tuple[Profile | None, Profile | None]:
    """The calibrator the collection serves and its shipped default, as profiles."""

    def export(calibrator_id: str) -> Profile:
        data = client.export_calibrator(collection, calibrator_id)
        return Profile.from_json(data.model_dump(mode="json"))

    served = None if ref is None or ref.id is None else export(ref.id)
    defaults = [c.id for c in client.iter_calibrators(collection) if c.default]
    default = export(defaults[0]) if defaults else None
    return served, default


def _reproduced(
    profile: Profile,
    hybrid: HybridRetrieval,
    corpus: EmbeddedCorpus,
    answers: Sequence[_Answer],
    qrels: Qrels,
) -> float:
    """Largest |p| difference between the server's answers and ``profile`` here."""
    worst = 0.0
    evidence = hybrid.evidence(corpus, qrels, hybrid.depth)
    for i, (e, answer) in enumerate(zip(evidence, answers, strict=True)):
        if not len(e.scores):
            continue
        here = profile.score(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, e.lexical
        ).probabilities
        theirs = {h.id: h.probability for h in (*answer.lexical, *answer.dense)}
        rows = hybrid.members(i, hybrid.depth)[0]
        served = np.array([theirs[corpus.ids[r]] or 0.0 for r in rows])
        worst = max(worst, float(np.max(np.abs(served - here))))
    return worst
