"""The lexical index of a collection: SQLite FTS5 over ``documents.text``, in the same file.

The FTS5 table is an *external-content* index of the ``documents`` table, kept in step by
triggers, so a document and its postings are written in the same transaction as the
vector and survive (or vanish with) a crash together. Texts are tokenised by FTS5's
``unicode61`` tokenizer with diacritics removed, optionally followed by the Porter
stemmer (chosen per collection at creation).

A user's query text is never handed to FTS5 as query syntax: :func:`match_expression`
splits it into word tokens itself and quotes each one, so quotes, ``NEAR``, ``*``,
``-``, column filters or unbalanced parentheses are just characters.

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

__all__ = [
    "FTS_TABLE",
    "STEMMERS",
    "LexicalHits",
    "Stemmer",
    "bm25_of",
    "idf_mass",
    "match_expression",
    "query_terms",
    "schema",
    "search",
]

Stemmer = Literal["porter", "none"]
STEMMERS: tuple[Stemmer, ...] = ("porter", "none")
FTS_TABLE = "documents_fts"
MAX_QUERY_TERMS = 64
"""Distinct query terms used for lexical scoring (the first ones, in query order)."""

# unicode61 treats letters, numbers and private-use characters as token characters and
# everything else (including "_") as a separator.
_TOKEN = re.compile(r"[^\W_]+")


def schema(stemmer: Stemmer) -> tuple[str, ...]:
    """Statements creating the index and the triggers that keep it in step.

    Needs a ``documents(seq INTEGER PRIMARY KEY, text TEXT, ...)`` table. A row
    replaced by ``INSERT OR REPLACE`` does not fire the delete trigger unless
    ``recursive_triggers`` is on, so writers delete explicitly before they insert.
    """
    if stemmer not in STEMMERS:
        raise ValueError(f"unknown stemmer {stemmer!r}")
    tokenize = "unicode61 remove_diacritics 2"
    if stemmer == "porter":
        tokenize = f"porter {tokenize}"
    t = FTS_TABLE
    return (
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {t} USING fts5(text, content='documents',"
        f" content_rowid='seq', tokenize='{tokenize}')",
        f"CREATE TRIGGER IF NOT EXISTS {t}_ai AFTER INSERT ON documents BEGIN"
        f" INSERT INTO {t}(rowid, text) VALUES (new.seq, new.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_ad AFTER DELETE ON documents BEGIN"
        f" INSERT INTO {t}({t}, rowid, text) VALUES ('delete', old.seq, old.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_au AFTER UPDATE OF text ON documents BEGIN"
        f" INSERT INTO {t}({t}, rowid, text) VALUES ('delete', old.seq, old.text);"
        f" INSERT INTO {t}(rowid, text) VALUES (new.seq, new.text); END",
    )


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
    terms = query_terms(text)
    return " OR ".join(_phrase(t) for t in terms) if terms else None


@dataclass(frozen=True)
class LexicalHits:
    """The best BM25 matches of one query (best first)."""

    seqs: NDArray[np.int64]
    scores: NDArray[np.float64]


def search(
    conn: sqlite3.Connection,
    text: str,
    n: int | None,
    allowed: NDArray[np.int64] | None = None,
) -> LexicalHits:
    """Top-``n`` documents by BM25 (every match if ``n`` is None), among ``allowed``.

    FTS5 scores every match to sort them anyway, so fetching all of them costs about
    what a ``LIMIT`` does; the ``allowed`` filter is applied here, in one pass, since
    an FTS5 match filtered by ``rowid IN (...)`` is re-run per row.
    """
    expr = match_expression(text)
    empty = LexicalHits(np.zeros(0, np.int64), np.zeros(0))
    if expr is None or (n is not None and n <= 0):
        return empty
    if allowed is not None and allowed.size == 0:
        return empty
    sql = (
        f"SELECT rowid, -bm25({FTS_TABLE}) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?"
        " ORDER BY rank"
    )
    params: tuple[object, ...] = (expr,)
    if n is not None and allowed is None:
        sql, params = sql + " LIMIT ?", (expr, n)
    rows = conn.execute(sql, params).fetchall()
    if allowed is not None:
        keep = set(allowed.tolist())
        rows = [r for r in rows if r[0] in keep][:n]
    return LexicalHits(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.float64),
    )


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
    terms = query_terms(text)
    if not terms:
        return 0.0
    counts = ", ".join(
        f"(SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?)" for _ in terms
    )
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM documents), {counts}",
        [_phrase(t) for t in terms],
    ).fetchone()
    total = int(row[0])
    if total == 0:
        return 0.0
    return float(
        sum(max(math.log((total - n + 0.5) / (n + 0.5)), 1e-6) for n in row[1:])
    )
