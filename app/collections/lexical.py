"""The lexical index of a collection: SQLite FTS5 over ``documents.text``, in the same file.

The FTS5 table is an *external-content* index of the ``documents`` table, kept in step by
triggers, so a document and its postings are written in the same transaction as the
vector and survive (or vanish with) a crash together. Texts are tokenised by FTS5's
``unicode61`` tokenizer with diacritics removed, optionally followed by the Porter
stemmer (chosen per collection at creation).

A user's query text is never handed to FTS5 as query syntax: :func:`match_expression`
splits it into word tokens itself and quotes each one, so quotes, ``NEAR``, ``*``,
``-``, column filters or unbalanced parentheses are just characters.

FTS5 keeps at most :data:`MAX_TOKEN_BYTES` (32,768) UTF-8 bytes of a token, in a
document and in a query alike, cutting the rest off byte-wise, possibly in the middle
of a character (a 3-byte character cut after 2 bytes). normcal keeps that one rule
and never re-tokenises: a token FTS5 hands back (``fts5vocab``) is read as bytes and
decoded by :func:`vocab_term`, losslessly (``surrogateescape``), so two tokens are one
key in the in-memory postings exactly when they are one term in FTS5. Cutting long
tokens at a character boundary before FTS5 sees them would need another text in the
index than ``documents.text`` (the triggers index the stored text itself) and would
leave the files already holding cut tokens broken; reading them back losslessly
serves both.

Scores are FTS5's BM25 (``k1=1.2``, ``b=0.75``) with the sign flipped, so larger is
better and a document that matches no query term scores 0. :func:`idf_mass` gives the
sum of the same IDFs over the query's terms, the per-query scale that makes a BM25
score comparable across queries (``calibration.features`` uses both).
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from app.settings import MAX_QUERY_TERMS
from calibration.features import LEXICAL_DEPTH, LexicalEvidence

__all__ = [
    "FTS_TABLE",
    "MAX_TOKEN_BYTES",
    "STEMMERS",
    "VOCAB_TERM",
    "LexicalHits",
    "Stemmer",
    "TermStats",
    "bm25_of",
    "idf_mass",
    "list_evidence",
    "list_index",
    "match_expression",
    "query_terms",
    "schema",
    "search",
    "search_with_mass",
    "term_stats",
    "tokenizer",
    "vocab_term",
]

Stemmer = Literal["porter", "none"]
STEMMERS: tuple[Stemmer, ...] = ("porter", "none")
FTS_TABLE = "documents_fts"
MAX_TOKEN_BYTES = 32_768
"""FTS5's bound on a token (``FTS5_MAX_TOKEN_SIZE``): longer ones are cut byte-wise."""
VOCAB_TERM = "CAST(term AS BLOB)"
"""Select this instead of an ``fts5vocab`` table's ``term``, then :func:`vocab_term`."""

# unicode61 treats letters, numbers and private-use characters as token characters and
# everything else (including "_") as a separator.
_TOKEN = re.compile(r"[^\W_]+")


def schema(stemmer: Stemmer) -> tuple[str, ...]:
    """Statements creating the index and the triggers that keep it in step.

    Needs a ``documents(seq INTEGER PRIMARY KEY, text TEXT, ...)`` table. A row
    replaced by ``INSERT OR REPLACE`` does not fire the delete trigger unless
    ``recursive_triggers`` is on, so writers delete explicitly before they insert.
    """
    t = FTS_TABLE
    return (
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {t} USING fts5(text, content='documents',"
        f" content_rowid='seq', tokenize='{tokenizer(stemmer)}')",
        f"CREATE TRIGGER IF NOT EXISTS {t}_ai AFTER INSERT ON documents BEGIN"
        f" INSERT INTO {t}(rowid, text) VALUES (new.seq, new.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_ad AFTER DELETE ON documents BEGIN"
        f" INSERT INTO {t}({t}, rowid, text) VALUES ('delete', old.seq, old.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_au AFTER UPDATE OF text ON documents BEGIN"
        f" INSERT INTO {t}({t}, rowid, text) VALUES ('delete', old.seq, old.text);"
        f" INSERT INTO {t}(rowid, text) VALUES (new.seq, new.text); END",
    )


def tokenizer(stemmer: Stemmer) -> str:
    """The FTS5 ``tokenize`` option of an index with this stemmer."""
    if stemmer not in STEMMERS:
        raise ValueError(f"unknown stemmer {stemmer!r}")
    tokenize = "unicode61 remove_diacritics 2"
    return f"porter {tokenize}" if stemmer == "porter" else tokenize


def vocab_term(raw: bytes) -> str:
    """A token as FTS5 stores it (``VOCAB_TERM``), as a string key.

    A token cut at :data:`MAX_TOKEN_BYTES` may end inside a character: its bytes are
    kept (``surrogateescape``), so distinct FTS5 terms stay distinct keys. These
    keys are never written back to SQLite nor shown to anyone.
    """
    return raw.decode("utf-8", "surrogateescape")


def query_terms(text: str) -> list[str]:
    """Distinct word tokens of ``text`` (lower-cased, query order, at most 64)."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(text.lower()):
        seen.setdefault(token, None)
        if len(seen) == MAX_QUERY_TERMS:
            break
    return list(seen)


def _phrase(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def match_expression(text: str) -> str | None:
    """An FTS5 query matching any of the text's terms; None when it has none.

    Every term is a quoted string, so it is tokenised (and stemmed) like the documents
    and never parsed as an operator.
    """
    return _expression(query_terms(text))


def _expression(terms: Sequence[str]) -> str | None:
    return " OR ".join(_phrase(t) for t in terms) if terms else None


@dataclass(frozen=True)
class TermStats:
    """The query's terms, how many documents there are and how many contain each term."""

    terms: list[str]
    total: int
    frequencies: list[int]

    def idf_mass(self) -> float:
        """Sum of the terms' IDFs (see :func:`idf_mass`)."""
        if self.total == 0:
            return 0.0
        n_all = self.total
        return float(
            sum(
                max(math.log((n_all - n + 0.5) / (n + 0.5)), 1e-6)
                for n in self.frequencies
            )
        )

    def floored(self) -> bool:
        """Whether some term is in at least half the documents.

        FTS5's BM25 floors such a term's IDF (``log((N - n + 0.5) / (n + 0.5)) <= 0``)
        at 1e-6, so it adds under ~1e-4 to any score; yet an OR query containing it
        visits (and scores) most of the collection.
        """
        return any(2 * n >= self.total for n in self.frequencies if n > 0)

    def informative(self) -> list[str]:
        """The terms that can move a score: in some document, in under half of them."""
        return [
            t
            for t, n in zip(self.terms, self.frequencies, strict=True)
            if 0 < n and 2 * n < self.total
        ]


def term_stats(conn: sqlite3.Connection, text: str) -> TermStats:
    """Document frequencies of the query's terms, in one statement."""
    terms = query_terms(text)
    counts = ", ".join(
        f"(SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?)" for _ in terms
    )
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM documents){', ' if terms else ''}{counts}",
        [_phrase(t) for t in terms],
    ).fetchone()
    return TermStats(terms, int(row[0]), [int(n) for n in row[1:]])


@dataclass(frozen=True)
class LexicalHits:
    """The best BM25 matches of one query (best first)."""

    seqs: NDArray[np.int64]
    scores: NDArray[np.float64]


_EMPTY = LexicalHits(np.zeros(0, np.int64), np.zeros(0))


def search(
    conn: sqlite3.Connection,
    text: str,
    n: int | None,
    allowed: NDArray[np.int64] | None = None,
    *,
    depth: int | None = None,
) -> LexicalHits:
    """Top-``n`` documents by BM25 (every match if ``n`` is None), among ``allowed``.

    With ``depth`` (capped at ``n``), only the first ``depth`` hits must be those of
    the full query, which lets a query skip terms in at least half the collection
    (:meth:`TermStats.floored`): the query then visits only documents that contain a
    rarer term, every score moves by under ~1e-4, and documents matching nothing but
    such terms (scored ~1e-6) are left out. When that leaves fewer than ``depth``
    hits, those documents would have filled the tail, so the full query is run.
    """
    if depth is None:
        return _search(conn, query_terms(text), n, allowed)
    stats = term_stats(conn, text)
    return _pruned(conn, stats, n, allowed, min(depth, n) if n is not None else depth)


def search_with_mass(
    conn: sqlite3.Connection,
    text: str,
    n: int | None,
    allowed: NDArray[np.int64] | None,
    *,
    depth: int,
) -> tuple[LexicalHits, float]:
    """:func:`search` with ``depth`` and :func:`idf_mass`, from one frequency lookup."""
    stats = term_stats(conn, text)
    depth = min(depth, n) if n is not None else depth
    return _pruned(conn, stats, n, allowed, depth), stats.idf_mass()


def _pruned(
    conn: sqlite3.Connection,
    stats: TermStats,
    n: int | None,
    allowed: NDArray[np.int64] | None,
    depth: int,
) -> LexicalHits:
    hits = _search(conn, stats.informative(), n, allowed)
    if not stats.floored() or hits.seqs.size >= depth:
        return hits  # only terms in no document were dropped, or the top is full
    return _search(conn, stats.terms, n, allowed)


def _search(
    conn: sqlite3.Connection,
    terms: Sequence[str],
    n: int | None,
    allowed: NDArray[np.int64] | None,
) -> LexicalHits:
    """Top-``n`` by BM25 over an OR of ``terms``, among ``allowed``.

    FTS5 scores every match even under ``ORDER BY rank LIMIT n``, and its sorted mode
    then seeks back to each row it returns (about as costly again), so the matches
    are fetched unsorted and sorted here: a stable sort of the rowid-ordered rows
    gives FTS5's own order, ties included. The ``allowed`` filter is applied here
    too, since an FTS5 match filtered by ``rowid IN (...)`` is re-run per row.
    """
    expr = _expression(terms)
    if expr is None or (n is not None and n <= 0):
        return _EMPTY
    if allowed is not None and allowed.size == 0:
        return _EMPTY
    rows = conn.execute(
        f"SELECT rowid, -bm25({FTS_TABLE}) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?",
        (expr,),
    ).fetchall()
    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    scores = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    if allowed is not None:
        keep = np.isin(seqs, allowed)
        seqs, scores = seqs[keep], scores[keep]
    order = np.argsort(-scores, kind="stable")[:n]
    return LexicalHits(seqs[order], scores[order])


def bm25_of(
    conn: sqlite3.Connection, text: str, seqs: Sequence[int]
) -> NDArray[np.float64]:
    """BM25 of the given documents for ``text`` (0 for one that matches no term)."""
    hits = search(conn, text, None)
    score = dict(zip(hits.seqs.tolist(), hits.scores.tolist(), strict=True))
    return np.array([score.get(int(s), 0.0) for s in seqs], dtype=np.float64)


def idf_mass(conn: sqlite3.Connection, text: str) -> float:
    """Sum over the query's terms of FTS5's BM25 IDF (0 for an empty collection).

    ``idf = log((N - n + 0.5) / (n + 0.5))``, floored at ``1e-6`` as FTS5 does, with
    ``n`` the number of documents containing the term. A term in no document still
    counts: it is part of what a perfect match would have had to contain.
    """
    return term_stats(conn, text).idf_mass()


def list_index(stemmer: Stemmer = "porter") -> sqlite3.Connection:
    """An empty in-memory index for :func:`list_evidence` (one per thread at a time)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    conn.execute("CREATE TABLE documents(seq INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    for statement in schema(stemmer):
        conn.execute(statement)
    return conn


def list_evidence(
    conn: sqlite3.Connection, text: str, documents: Sequence[str]
) -> LexicalEvidence:
    """BM25 evidence of a candidate list, the list itself its collection.

    The candidates are indexed in ``conn`` (a :func:`list_index`; emptied first and
    rolled back after, so it can be reused) and scored by FTS5 exactly as a
    collection's own index would score them: ``N`` is the number of candidates, each
    IDF the term's spread over them. Ranks are FTS5's order of the matches (a
    candidate matching no query term has none: ``LEXICAL_DEPTH + 1``).
    """
    conn.execute("BEGIN")
    try:
        conn.execute("DELETE FROM documents")
        conn.executemany(
            "INSERT INTO documents(seq, text) VALUES (?, ?)", enumerate(documents)
        )
        stats = term_stats(conn, text)
        hits = _search(conn, stats.terms, None, None)
    finally:
        conn.execute("ROLLBACK")
    bm25 = np.zeros(len(documents))
    bm25[hits.seqs] = hits.scores
    rank = np.full(len(documents), float(LEXICAL_DEPTH + 1))
    rank[hits.seqs] = np.minimum(np.arange(1, hits.seqs.size + 1), LEXICAL_DEPTH + 1)
    return LexicalEvidence(
        bm25=bm25,
        rank=rank,
        idf_mass=stats.idf_mass(),
        top=float(hits.scores[0]) if hits.scores.size else 0.0,
    )
