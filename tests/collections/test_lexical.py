"""The lexical module against a real in-memory SQLite FTS5 index (no model).

A user's query text is data, never FTS5 syntax: whatever the string, building the
match expression and searching must neither raise nor match a document that has
none of the query's words.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.collections import lexical
from calibration.features import LEXICAL_DEPTH
from tests.conftest import shared_dataset

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


def _reference(
    conn: sqlite3.Connection, text: str, allowed: set[int] | None = None
) -> list[tuple[int, float]]:
    """Every match of an OR of all the query's terms, in FTS5's own rank order (the
    implementation before pruning and client-side sorting)."""
    expr = lexical.match_expression(text)
    if expr is None:
        return []
    rows = conn.execute(
        f"SELECT rowid, -bm25({lexical.FTS_TABLE}) FROM {lexical.FTS_TABLE}"
        f" WHERE {lexical.FTS_TABLE} MATCH ? ORDER BY rank",
        (expr,),
    ).fetchall()
    return [(int(r), float(s)) for r, s in rows if allowed is None or r in allowed]


@pytest.fixture(scope="module")
def scifact() -> Iterator[tuple[sqlite3.Connection, list[str]]]:
    """3,000 scifact abstracts in a porter index, and the scifact queries."""
    data = shared_dataset("scifact")
    with (data / "corpus.jsonl").open(encoding="utf-8") as fh:
        texts = [
            f"{row['title']}\n{row['text']}"
            for row in map(json.loads, fh.readlines()[:3000])
        ]
    with (data / "queries.jsonl").open(encoding="utf-8") as fh:
        queries = [json.loads(line)["text"] for line in fh]
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE documents (seq INTEGER PRIMARY KEY, text TEXT)")
    for statement in lexical.schema("porter"):
        conn.execute(statement)
    conn.executemany("INSERT INTO documents (text) VALUES (?)", [(t,) for t in texts])
    yield conn, queries
    conn.close()


def _assert_same_top(
    hits: lexical.LexicalHits, reference: list[tuple[int, float]], depth: int
) -> None:
    """The same ranking to ``depth`` up to near-ties: the score at every rank and of
    every document within 1e-3 (the IDF floor's share), so two documents can only
    swap when their scores are that close."""
    top, full = reference[:depth], dict(reference)
    assert hits.seqs.size >= len(top)
    np.testing.assert_allclose(hits.scores[:depth], [s for _, s in top], atol=1e-3)
    np.testing.assert_allclose(
        hits.scores[:depth], [full[s] for s in hits.seqs[:depth].tolist()], atol=1e-3
    )
    floor = top[-1][1] + 1e-3 if top else 0.0
    assert {r for r, s in top if s > floor} <= set(hits.seqs[:depth].tolist())


@pytest.mark.slow  # real data (3,000 scifact abstracts)
def test_pruned_search_gives_the_full_query_top_on_a_real_corpus(scifact):
    """Terms in half the collection are skipped, yet the BM25 top to LEXICAL_DEPTH,
    every score of a document still matched and the IDF mass are unchanged."""
    conn, queries = scifact
    pruned = 0
    for text in queries[:150]:
        reference = _reference(conn, text)
        hits, mass = lexical.search_with_mass(
            conn, text, None, None, depth=LEXICAL_DEPTH
        )
        _assert_same_top(hits, reference, LEXICAL_DEPTH)
        full = dict(reference)
        np.testing.assert_allclose(
            hits.scores, [full[s] for s in hits.seqs.tolist()], atol=1e-3
        )
        assert mass == pytest.approx(lexical.idf_mass(conn, text))
        assert lexical.search(conn, text, None).seqs.tolist() == [
            r for r, _ in reference
        ]  # without depth: every match, as before
        pruned += lexical.term_stats(conn, text).floored()
    assert pruned > 10  # the queries did exercise the pruning


@pytest.mark.slow  # real data (3,000 scifact abstracts)
def test_pruned_search_respects_allowed_and_n(scifact):
    conn, queries = scifact
    allowed = np.arange(1, 3001, 3, dtype=np.int64)
    for text in queries[:40]:
        reference = _reference(conn, text, set(allowed.tolist()))
        hits, _ = lexical.search_with_mass(conn, text, 10, allowed, depth=100)
        assert hits.seqs.size == min(10, len(reference))
        _assert_same_top(hits, reference, 10)


@pytest.mark.slow  # real data (3,000 scifact abstracts)
def test_too_few_rare_matches_fall_back_to_the_full_query(scifact):
    """When the informative terms match fewer than ``depth`` documents, the ones that
    match only common terms still fill the tail, in FTS5's order."""
    conn, _ = scifact
    text = "the of and aspirin"
    stats = lexical.term_stats(conn, text)
    assert stats.floored() and 0 < sum(stats.frequencies[3:]) < LEXICAL_DEPTH
    hits, _ = lexical.search_with_mass(conn, text, None, None, depth=LEXICAL_DEPTH)
    reference = _reference(conn, text)
    assert len(reference) > LEXICAL_DEPTH
    assert hits.seqs.tolist() == [r for r, _ in reference]


@pytest.mark.parametrize("text", ["fox dog", "run", "zymurgy fermentation", "nothing"])
def test_a_candidate_list_is_scored_as_a_collection_of_its_own(text):
    """``list_evidence`` gives what an index of just those texts gives, reusably."""
    order = [5, 2, 1, 4]  # a retriever's order (seq numbers of TEXTS)
    texts = [TEXTS[s] for s in order]
    own = sqlite3.connect(":memory:", isolation_level=None)
    own.execute("CREATE TABLE documents (seq INTEGER PRIMARY KEY, text TEXT)")
    for statement in lexical.schema("porter"):
        own.execute(statement)
    own.executemany("INSERT INTO documents VALUES (?, ?)", enumerate(texts))
    index = lexical.list_index("porter")
    for _ in range(2):  # the index is emptied between lists
        evidence = lexical.list_evidence(index, text, texts)
        np.testing.assert_allclose(
            evidence.bm25, lexical.bm25_of(own, text, range(len(texts)))
        )
        assert evidence.idf_mass == pytest.approx(lexical.idf_mass(own, text))
        hits = lexical.search(own, text, None)
        assert evidence.top == (float(hits.scores[0]) if hits.scores.size else 0.0)
        expected = np.full(len(texts), float(LEXICAL_DEPTH + 1))
        expected[hits.seqs] = np.arange(1, hits.seqs.size + 1)
        np.testing.assert_array_equal(evidence.rank, expected)
    assert index.execute("SELECT COUNT(*) FROM documents").fetchone() == (0,)
    own.close()
    index.close()
