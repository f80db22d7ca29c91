"""The lexical module against a real in-memory SQLite FTS5 index (no model).

A user's query text is data, never FTS5 syntax: whatever the string, building the
match expression and searching must neither raise nor match a document that has
none of the query's words.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.collections import lexical

TEXTS = {
    1: "The quick brown fox jumps over the lazy dog",
    2: "NEAR the river a fox runs; text: foo AND bar",
    3: "Café naïve résumé über straße",
    4: "zymurgy is the chemistry of fermentation",
    5: "running runners ran quickly",
}
FTS5_SYNTAX = [
    '"',
    '""',
    '"fox',
    "NEAR(fox dog)",
    "NEAR(",
    "fox*",
    "*",
    "-fox",
    "^fox",
    "text:fox",
    "documents_fts:fox",
    "{text}: fox",
    "(fox OR (dog",
    "fox) AND (dog",
    "AND",
    "OR NOT AND",
    "fox NOT dog",
    "+",
    "",
    "   ",
    "!!! ??? ...",
    "fox\x00dog",
    "\x00",
    "\x01\x02\x1f\x7f",
    "e\u0301",  # combining acute accent
    "\u0301\u0302",
    "caf\u00e9",
    "\u00b2\u2460",  # numbers unicode61 and Python may see differently
    "\ufffd",
    "\U0001f600 fox",
    "fox " * 5000,
    " ".join(f"w{i}" for i in range(500)),
]


def _index(stemmer: lexical.Stemmer) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE documents (seq INTEGER PRIMARY KEY, text TEXT)")
    for statement in lexical.schema(stemmer):
        conn.execute(statement)
    conn.executemany("INSERT INTO documents VALUES (?, ?)", TEXTS.items())
    return conn


@pytest.fixture(scope="module")
def conn() -> Iterator[sqlite3.Connection]:
    c = _index("porter")
    yield c
    c.close()


def _check_never_raises(conn: sqlite3.Connection, text: str) -> None:
    expr = lexical.match_expression(text)
    assert (expr is None) == (not lexical.query_terms(text))
    hits = lexical.search(conn, text, 10)
    assert len(hits.seqs) == len(hits.scores) <= 10
    assert np.all(hits.scores > 0)
    assert list(hits.scores) == sorted(hits.scores, reverse=True)
    restricted = lexical.search(conn, text, 10, np.array([1, 3], dtype=np.int64))
    assert set(restricted.seqs.tolist()) <= {1, 3}
    scores = lexical.bm25_of(conn, text, list(TEXTS))
    assert scores.shape == (len(TEXTS),) and np.all(scores >= 0)
    by_seq = dict(zip(hits.seqs.tolist(), hits.scores.tolist(), strict=True))
    for seq, score in by_seq.items():
        assert scores[list(TEXTS).index(seq)] == pytest.approx(score)
    assert lexical.idf_mass(conn, text) >= 0


@pytest.mark.parametrize("text", FTS5_SYNTAX)
def test_fts5_syntax_is_only_text(conn, text):
    _check_never_raises(conn, text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
@example("fox \x00 \u0301 NEAR( * - ^ text: (")
def test_any_unicode_query_never_raises(conn, text):
    _check_never_raises(conn, text)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.text(alphabet=st.sampled_from(list('"*-^:()+{}, NEARANDORNOTfox')), max_size=60)
)
def test_operator_soup_never_raises(conn, text):
    _check_never_raises(conn, text)


def test_operators_are_words_not_syntax(conn):
    # NEAR, AND and a column filter are plain words: they match only where they occur.
    assert set(lexical.search(conn, "NEAR", 10).seqs.tolist()) == {2}
    assert set(lexical.search(conn, "text: foo", 10).seqs.tolist()) == {2}
    # "-fox" does not exclude fox; "fox*" is not a prefix query.
    assert set(lexical.search(conn, "-fox", 10).seqs.tolist()) == {1, 2}
    assert lexical.search(conn, "fo*", 10).seqs.size == 0


def test_only_documents_with_a_query_term_match_in_bm25_order(conn):
    hits = lexical.search(conn, "fox zymurgy", 10)
    assert set(hits.seqs.tolist()) == {1, 2, 4}
    # The rare term outweighs the common one.
    assert hits.seqs[0] == 4
    assert lexical.search(conn, "unrelated words entirely", 10).seqs.size == 0


def test_diacritics_are_removed(conn):
    assert lexical.search(conn, "cafe naive resume", 10).seqs.tolist() == [3]
    assert lexical.search(conn, "CAFÉ", 10).seqs.tolist() == [3]


def test_porter_stems_and_none_does_not():
    porter, plain = _index("porter"), _index("none")
    try:
        assert 5 in lexical.search(porter, "run", 10).seqs.tolist()  # "running"
        assert 5 not in lexical.search(plain, "run", 10).seqs.tolist()
        assert lexical.search(plain, "running", 10).seqs.tolist() == [5]
    finally:
        porter.close()
        plain.close()


def test_unknown_stemmer_is_refused():
    with pytest.raises(ValueError, match="stemmer"):
        lexical.schema("snowball")  # type: ignore[arg-type]
