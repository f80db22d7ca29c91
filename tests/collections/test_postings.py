"""In-memory postings against real SQLite FTS5: same matches, scores, order, IDF mass.

The reference is always FTS5 itself (``lexical.search`` of the full query and
``lexical.idf_mass``) over the same file, read by its own connection.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from app.collections import lexical
from app.collections.postings import Postings, Tokenizer
from app.collections.registry import Collection, CollectionRegistry
from app.collections.store import CollectionStore, NewDocument
from tests.collections.conftest import DIM, unit_vectors
from tests.conftest import shared_dataset

TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "Running runners ran quickly; the runner runs",
    "Café naïve résumé über straße CAFE cafe",
    "snake_case_words and under_scores, 42 items at 3.14 and 2024-01-01",
    "数据 检索 日本語のテキスト Ελληνικά κείμενα",
    "",
    "fox fox fox fox fox",
    "zymurgy is the chemistry of fermentation, like brewing beer",
    "the the the the of of a a an",
    "Ünïcödé dîâcrîtîcs everywhere: ñandú, Ærøskøbing, Øresund",
]
QUERIES = [
    "quick fox",
    "runs running runner",  # one stem, three phrases
    "cafe café CAFÉ",  # one token after folding, three phrases
    "snake_case 42 3 14",
    "数据 Ελληνικά",
    "the a of",  # floored IDFs
    "nothingmatchesthis",
    "fox nothingmatchesthis",
    "",
    "!!! ???",
    "ñandu aerøskøbing oresund",
    "fox \u19b0",  # a term FTS5 tokenises to nothing
]
# Letters to Python, separators to SQLite's unicode61 (New Tai Lue vowels, spacing
# marks before Unicode 8): "x<letter>y" is one query term and a two-token phrase.
NEWER_LETTERS = ["\u19b0", "\u19c8", "\u1cf2"]


def _fts(texts: list[str], stemmer: lexical.Stemmer) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE documents (seq INTEGER PRIMARY KEY, text TEXT)")
    for statement in lexical.schema(stemmer):
        conn.execute(statement)
    conn.executemany("INSERT INTO documents VALUES (?, ?)", enumerate(texts, start=1))
    return conn


def assert_same(
    got: tuple[lexical.LexicalHits, float], ref: tuple[lexical.LexicalHits, float]
) -> None:
    """Same matches, scores within 1e-9 relative, same order up to exact ties."""
    (hits, mass), (want, want_mass) = got, ref
    assert mass == pytest.approx(want_mass, rel=1e-12, abs=0.0)
    assert sorted(hits.seqs.tolist()) == sorted(want.seqs.tolist())
    by_seq = dict(zip(want.seqs.tolist(), want.scores.tolist(), strict=True))
    expected = np.array([by_seq[s] for s in hits.seqs.tolist()])
    np.testing.assert_allclose(hits.scores, expected, rtol=1e-9, atol=0.0)
    assert np.all(np.diff(expected) <= 0.0)  # FTS5's own scores, in our order
    ties = np.diff(want.scores) == 0.0
    if not ties.any():
        assert hits.seqs.tolist() == want.seqs.tolist()


def _reference(
    conn: sqlite3.Connection,
    text: str,
    n: int | None = None,
    allowed: NDArray[np.int64] | None = None,
) -> tuple[lexical.LexicalHits, float]:
    return lexical.search(conn, text, n, allowed), lexical.idf_mass(conn, text)


@pytest.mark.parametrize("stemmer", lexical.STEMMERS)
def test_synthetic_text_scores_as_fts5(stemmer: lexical.Stemmer) -> None:
    conn = _fts(TEXTS, stemmer)
    postings = Postings.build(conn, stemmer)
    assert postings.count == len(TEXTS)
    assert Tokenizer(stemmer).terms(["\u19b0", "fox"]) == [
        (),
        ("fox",),
    ]  # so "fox \u19b0" has such a term
    allowed = np.array([1, 3, 7, 9, 99], dtype=np.int64)
    for text in QUERIES:
        for n, keep in ((None, None), (2, None), (None, allowed), (1, allowed)):
            got = postings.search(text, n, keep)
            assert got is not None, text
            assert_same(got, _reference(conn, text, n, keep))
        zero = postings.search(text, 0, None)
        assert zero is not None and zero[0].seqs.size == 0
        assert zero[1] == pytest.approx(lexical.idf_mass(conn, text), rel=1e-12)
        empty = postings.search(text, None, np.zeros(0, np.int64))
        assert empty is not None and empty[0].seqs.size == 0


def test_repeated_stems_are_separate_phrases() -> None:
    """ "runs running" scores "run" twice in FTS5; so do the postings."""
    conn = _fts(TEXTS, "porter")
    postings = Postings.build(conn, "porter")
    once, twice = (
        postings.search("runs", None, None),
        postings.search("runs running", None, None),
    )
    assert once is not None and twice is not None
    np.testing.assert_allclose(twice[0].scores, 2 * once[0].scores, rtol=1e-12)
    assert_same(twice, _reference(conn, "runs running"))


def _phrase_term(tokenizer: Tokenizer) -> str:
    for letter in NEWER_LETTERS:
        term = f"fox{letter}dog"
        if lexical.query_terms(term) == [term] and tokenizer.terms([term]) == [
            ("fox", "dog")
        ]:
            return term
    pytest.fail("no letter is a separator to this SQLite's unicode61")


def test_a_term_of_several_tokens_goes_to_fts5(store: CollectionStore) -> None:
    """FTS5 reads such a term as a phrase; the postings decline, FTS5 answers."""
    term = _phrase_term(Tokenizer("porter"))
    docs = [_doc(f"d{i}", text) for i, text in enumerate(TEXTS)]
    store.upsert(docs)
    query = f"quick {term}"
    reader = _reader(store.path)
    try:
        assert Postings.build(reader, "porter").search(query, None, None) is None
        got = store.lexical_search(query, None, None, depth=10**6)
        assert_same(got, _reference(reader, query))
    finally:
        reader.close()
    assert got[0].seqs.size > 0


def test_scifact_scores_as_fts5() -> None:
    path = shared_dataset("scifact")
    with (path / "corpus.jsonl").open(encoding="utf-8") as f:
        texts = [
            f"{d.get('title', '')} {d['text']}"
            for d in (json.loads(line) for line, _ in zip(f, range(3000), strict=False))
        ]
    with (path / "queries.jsonl").open(encoding="utf-8") as f:
        queries = [
            json.loads(line)["text"] for line, _ in zip(f, range(200), strict=False)
        ]
    assert len(texts) == 3000 and len(queries) >= 150
    for stemmer in lexical.STEMMERS:
        conn = _fts(texts, stemmer)
        postings = Postings.build(conn, stemmer)
        for text in queries:
            got = postings.search(text, None, None)
            assert got is not None, text
            assert_same(got, _reference(conn, text))


# -- freshness ----------------------------------------------------------------------


def _doc(doc_id: str, text: str, seed: int = 0, **metadata: str) -> NewDocument:
    return NewDocument(
        id=doc_id,
        text=text,
        metadata=dict(metadata),
        vector=unit_vectors(1, seed)[0],
        norm=1.0,
        n_tokens=3,
        truncated=False,
    )


def _reader(path: Path) -> sqlite3.Connection:
    """Another connection to the file: FTS5's answer, as any other process sees it."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[CollectionRegistry[dict[str, object]]]:
    opened = CollectionRegistry(
        tmp_path / "data",
        model_name="m",
        dim=DIM,
        synchronous="OFF",
        load_calibrator=dict,
    )
    opened.load()
    yield opened
    opened.close()


def _check(collection: Collection[dict[str, object]], path: Path) -> None:
    reader = _reader(path)
    try:
        for text in (*QUERIES, "brewing beer fox", "new words arrive"):
            got = collection._store.lexical_search(text, None, None, depth=10**6)
            assert_same(got, _reference(reader, text))
    finally:
        reader.close()


def test_collection_writes_reach_the_postings(registry) -> None:
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert(
        [_doc(f"d{i}", t, i, part=str(i % 2)) for i, t in enumerate(TEXTS)]
    )
    _check(collection, path)  # built here
    collection.upsert([_doc("new", "new words arrive with a fox", 50)])
    _check(collection, path)
    collection.upsert([_doc("d0", "replaced: brewing beer, no animal", 51)])
    _check(collection, path)
    collection.delete("d1")
    _check(collection, path)
    assert collection.delete_ids(["d2", "d3", "missing"]) == 2
    _check(collection, path)
    assert collection.delete_where({"part": "1"}) > 0
    _check(collection, path)
    collection.upsert([_doc(f"e{i}", f"fox {i} beer", 60 + i) for i in range(5)])
    _check(collection, path)
    assert collection.delete_where({}) > 0
    _check(collection, path)
    collection.upsert([_doc("back", "the fox is back", 70)])
    _check(collection, path)


def _write_elsewhere(path: Path, statement: str, params: tuple[object, ...]) -> None:
    """A write by another connection (another process, to SQLite)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute(statement, params)
    finally:
        conn.close()


_INSERT = (
    "INSERT INTO documents(id, text, metadata, vector, norm, n_tokens, truncated,"
    " updated_at) VALUES (?, ?, '{}', ?, 1.0, 3, 0, 0.0)"
)


def test_a_write_by_another_connection_is_seen(registry) -> None:
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    _check(collection, path)
    vector = unit_vectors(1, 9)[0].tobytes()
    _write_elsewhere(
        path, _INSERT, ("x", "new words arrive from elsewhere, fox", vector)
    )
    _check(collection, path)
    _write_elsewhere(path, "DELETE FROM documents WHERE id = ?", ("d6",))
    _check(collection, path)


def test_a_reopened_connection_rebuilds(registry) -> None:
    """``data_version`` restarts with a connection: a write while it was closed counts."""
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    for _ in range(2):  # the second connection's count starts where the first's did
        assert collection._store.release_connection()
        _check(collection, path)
    assert collection._store.release_connection()
    vector = unit_vectors(1, 9)[0].tobytes()
    _write_elsewhere(path, _INSERT, ("x", "new words arrive while closed", vector))
    _check(collection, path)


def test_searches_during_writes_see_one_state(registry) -> None:
    """Each write adds one "zebra" document and three others, under the write lock:
    a search sees k zebras among 4k documents, its IDF mass and scores agreeing."""
    collection = registry.create("kb")
    writes, searchers = 15, 3
    barrier = threading.Barrier(searchers + 1)
    done = threading.Event()
    seen: list[tuple[int, float, list[float]]] = []
    errors: list[BaseException] = []
    vectors = unit_vectors(1, 1)

    def write() -> None:
        barrier.wait(timeout=60)
        try:
            for k in range(writes):
                texts = [f"zebra number {k}", "plain", "plain text", "more plain text"]
                collection.upsert(
                    [_doc(f"{k}-{j}", t, 100 + 4 * k + j) for j, t in enumerate(texts)]
                )
        finally:
            done.set()

    def search() -> None:
        try:
            barrier.wait(timeout=60)
            for _ in range(2000):
                (pool,) = collection.search(vectors, ["zebra"], 1000)
                scores = [float(pool.lexical.bm25[i]) for i in pool.lexical_order]
                seen.append((len(scores), pool.lexical.idf_mass, scores))
                if done.is_set():
                    return
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=search) for _ in range(searchers)]
    threads.append(threading.Thread(target=write))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(not t.is_alive() for t in threads)
    assert seen
    for k, mass, scores in seen:
        total = 4 * k
        want = max(math.log((total - k + 0.5) / (k + 0.5)), 1e-6) if total else 0.0
        assert mass == pytest.approx(want, rel=1e-12)
        assert all(s > 0 for s in scores)
    _check(collection, registry.file_of("kb"))
