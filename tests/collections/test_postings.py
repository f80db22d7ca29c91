"""In-memory postings against real SQLite FTS5: same matches, scores, order, IDF mass.

The reference is always FTS5 itself (``lexical.search`` of the full query and
``lexical.idf_mass``) over the same file, read by its own connection.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from app.collections import lexical
from app.collections import store as store_module
from app.collections.base import NewDocument
from app.collections.postings import Postings, Tokenizer, top_order
from app.collections.registry import Collection, CollectionRegistry
from app.collections.store import CollectionStore
from app.schemas.filters import MATCH_ALL
from calibration.features import LEXICAL_DEPTH
from calibration.fusion import candidate_pool, lexical_ranks
from tests.collections.conftest import DIM, unit_vectors, where
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


def _ranked(
    postings: Postings,
    text: str,
    n: int | None = None,
    allowed: NDArray[np.int64] | None = None,
) -> tuple[lexical.LexicalHits, float]:
    ranking = postings.rank(text, allowed, n)
    assert ranking is not None, text
    return ranking.top, ranking.idf_mass


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
            assert_same(
                _ranked(postings, text, n, keep), _reference(conn, text, n, keep)
            )
        zero = _ranked(postings, text, 0)
        assert zero[0].seqs.size == 0
        assert zero[1] == pytest.approx(lexical.idf_mass(conn, text), rel=1e-12)
        assert _ranked(postings, text, None, np.zeros(0, np.int64))[0].seqs.size == 0


def test_repeated_stems_are_separate_phrases() -> None:
    """ "runs running" scores "run" twice in FTS5; so do the postings."""
    conn = _fts(TEXTS, "porter")
    postings = Postings.build(conn, "porter")
    once, twice = _ranked(postings, "runs"), _ranked(postings, "runs running")
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
        assert Postings.build(reader, "porter").rank(query, None, None) is None
        assert store.wait_lexical(timeout=60)
        ranking = store.lexical_search(query, None, depth=10**6)
        got = ranking.top, ranking.idf_mass
        assert_same(got, _reference(reader, query))
    finally:
        reader.close()
    assert got[0].seqs.size > 0


def _scifact(n_docs: int, n_queries: int) -> tuple[list[str], list[str]]:
    """The first scifact abstracts (title and text) and queries."""
    path = shared_dataset("scifact")
    with (path / "corpus.jsonl").open(encoding="utf-8") as f:
        lines = (json.loads(line) for line, _ in zip(f, range(n_docs), strict=False))
        texts = [f"{d.get('title', '')} {d['text']}" for d in lines]
    with (path / "queries.jsonl").open(encoding="utf-8") as f:
        queries = [
            json.loads(line)["text"]
            for line, _ in zip(f, range(n_queries), strict=False)
        ]
    return texts, queries


@pytest.mark.slow
def test_scifact_scores_as_fts5() -> None:
    texts, queries = _scifact(3000, 200)
    assert len(texts) == 3000 and len(queries) >= 150
    for stemmer in lexical.STEMMERS:
        conn = _fts(texts, stemmer)
        postings = Postings.build(conn, stemmer)
        for text in queries:
            assert_same(_ranked(postings, text), _reference(conn, text))


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


def _check(
    collection: Collection[dict[str, object]], path: Path, *, built: bool = True
) -> None:
    """The collection's lexical searches are FTS5's: from its postings if ``built``,
    from FTS5 itself otherwise (the caller holds the build)."""
    store = collection._store
    if built:
        assert store.wait_lexical(timeout=120)
    reader = _reader(path)
    try:
        for text in (*QUERIES, "brewing beer fox", "new words arrive"):
            ranking = store.lexical_search(text, None, depth=10**6)
            assert_same((ranking.top, ranking.idf_mass), _reference(reader, text))
    finally:
        reader.close()
    assert (store._postings is not None) == built


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
    assert collection.delete_where(where({"part": "1"})) > 0
    _check(collection, path)
    collection.upsert([_doc(f"e{i}", f"fox {i} beer", 60 + i) for i in range(5)])
    _check(collection, path)
    assert collection.delete_where(where({})) > 0
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
    _check(collection, path)  # no build holds the store's mutex from here on
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


# -- the pool's top and lookups ------------------------------------------------------


def test_top_order_is_the_stable_full_sort() -> None:
    """Few distinct scores: many ties at every cut-off, broken by index as a stable
    sort of all of them would."""
    rng = np.random.default_rng(3)
    for size in (0, 1, 7, 300):
        scores = rng.integers(0, 5, size).astype(np.float64)
        full = np.argsort(-scores, kind="stable")
        for n in (None, 0, 1, 2, 50, 99, 100, 299, 300, 301):
            assert top_order(scores, n).tolist() == full[:n].tolist()


def _todays_evidence(
    collection: Collection[dict[str, object]],
    vector: NDArray[np.float32],
    text: str,
    n: int,
    allowed: NDArray[np.int64] | None,
) -> tuple[
    list[int], list[int], NDArray[np.float64], NDArray[np.float64], float, float
]:
    """The pool and its lexical evidence as ``Collection._pool`` computed them before
    the top was cut: every match ranked (a stable sort of all), BM25 from that list."""
    postings = collection._store._postings
    assert postings is not None
    full = postings.rank(text, allowed, None)
    assert full is not None
    _, dense_seqs = collection.index.search(vector[None, :], n, allowed)
    dense = [int(s) for s in dense_seqs[0] if s >= 0]
    lex_seqs = [int(s) for s in full.top.seqs]
    seqs = candidate_pool(dense, lex_seqs, n)
    bm25 = dict(zip(lex_seqs, full.top.scores.tolist(), strict=True))
    at = {s: i for i, s in enumerate(seqs)}
    return (
        seqs,
        [at[s] for s in lex_seqs[:n] if s in at],
        np.array([bm25.get(s, 0.0) for s in seqs], dtype=np.float64),
        lexical_ranks(seqs, lex_seqs),
        full.idf_mass,
        float(full.top.scores[0]) if full.top.scores.size else 0.0,
    )


def _assert_todays_pools(
    collection: Collection[dict[str, object]], queries: list[str]
) -> None:
    assert collection._store.wait_lexical(timeout=120)
    vectors = unit_vectors(len(queries), 77)
    allowed = collection._store.filter_seqs(where({"part": "0"}))
    for flt, keep in ((MATCH_ALL, None), (where({"part": "0"}), allowed)):
        for n in (10, LEXICAL_DEPTH, 150):
            pools = collection.search(vectors, queries, n, flt)
            for i, (text, pool) in enumerate(zip(queries, pools, strict=True)):
                seqs, order, bm25, rank, mass, top = _todays_evidence(
                    collection, vectors[i], text, n, keep
                )
                assert [h.document.seq for h in pool.hits] == seqs, text
                assert pool.lexical_order == order
                assert np.array_equal(pool.lexical.bm25, bm25), text
                assert np.array_equal(pool.lexical.rank, rank), text
                assert pool.lexical.idf_mass == mass
                assert pool.lexical.top == top


def test_pool_evidence_with_ties_at_the_cut_off(registry) -> None:
    """250 identical "fox" documents straddle every cut-off (10, 100, 150)."""
    collection = registry.create("kb")
    texts = [
        *(["the fox"] * 250),
        *(["fox fox dog"] * 30),
        *(f"dog number {i}" for i in range(200)),
        *(["the fox"] * 50),  # ties again, at higher seqs
    ]
    collection.upsert(
        [_doc(f"d{i}", t, i, part=str(i % 3 % 2)) for i, t in enumerate(texts)]
    )
    _assert_todays_pools(collection, ["fox", "fox dog", "the fox dog number 7", "cat"])


@pytest.mark.slow
def test_pool_evidence_on_scifact(registry) -> None:
    texts, queries = _scifact(3000, 60)
    collection = registry.create("kb")
    for start in range(0, len(texts), 1000):
        collection.upsert(
            [
                _doc(f"d{i}", texts[i], i, part=str(i % 2))
                for i in range(start, min(start + 1000, len(texts)))
            ]
        )
    _assert_todays_pools(collection, queries)


# -- the background build ------------------------------------------------------------


class _Gate:
    """Holds every postings read (a build past its snapshot) until opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        read = Postings.read

        def held(cls: type[Postings], conn: sqlite3.Connection, stemmer):  # type: ignore[no-untyped-def]
            self.entered.set()
            assert self.opened.wait(timeout=120)
            return read(conn, stemmer)

        monkeypatch.setattr(Postings, "read", classmethod(held))


def _builds_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lexical-build"]


def test_searches_during_a_build_use_fts5_and_its_writes_are_kept(
    registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(monkeypatch)
    collection = registry.create("kb")  # its build starts, and is held
    assert gate.entered.wait(timeout=60)
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    _check(collection, path, built=False)  # FTS5 answers, the build is held
    (pool,) = collection.search(unit_vectors(1, 5), ["fox"], 5)
    assert pool.lexical.bm25.max() > 0
    collection.delete("d7")
    gate.opened.set()
    _check(collection, path)  # the writes made during the build were applied
    postings = collection._store._postings
    assert postings is not None and postings.count == len(TEXTS) - 1


def test_closing_during_a_build_leaves_no_wal_behind(
    registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's read-only connection closes before the store's own: the last to
    close checkpoints and removes ``-wal`` and ``-shm`` (a read-only one cannot)."""
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    _check(collection, path)
    gate = _Gate(monkeypatch)
    _write_elsewhere(path, "DELETE FROM documents WHERE id = ?", ("d6",))
    _check(collection, path, built=False)  # starts a build, held with its connection
    assert gate.entered.wait(timeout=60)
    closing = threading.Thread(target=collection.close)
    closing.start()  # cancels the build and waits for it
    gate.opened.set()
    closing.join(120)
    assert not closing.is_alive()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_build_overtaken_by_another_connection_is_discarded(
    registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign write during the build: FTS5 keeps answering, the next build serves."""
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    _check(collection, path)
    gate = _Gate(monkeypatch)
    vector = unit_vectors(1, 9)[0].tobytes()
    _write_elsewhere(path, _INSERT, ("x", "new words arrive from elsewhere", vector))
    store = collection._store
    _check(collection, path, built=False)  # starts a build, held
    assert gate.entered.wait(timeout=60)
    build = store._build
    assert build is not None
    _write_elsewhere(path, "DELETE FROM documents WHERE id = ?", ("d6",))
    gate.opened.set()
    assert build.done.wait(timeout=120)
    assert store._postings is None and store._build is None  # discarded
    _check(collection, path)  # the next search builds again


def test_a_failed_build_leaves_searches_on_fts5(
    registry, caplog: pytest.LogCaptureFixture
) -> None:
    """The file vanished from its name: the build cannot open it, searches go on."""
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    assert collection._store.wait_lexical(timeout=60)
    vector = unit_vectors(1, 9)[0].tobytes()
    _write_elsewhere(path, _INSERT, ("x", "new words arrive from elsewhere", vector))
    reader = _reader(path)
    try:
        want = {text: _reference(reader, text) for text in QUERIES}
    finally:
        reader.close()
    store = collection._store
    moved = path.with_name("moved")
    path.rename(moved)
    try:
        assert not store.wait_lexical(timeout=60)  # the build failed
        assert store._build is None
        for text in QUERIES:  # FTS5 on the open connection; no new build
            ranking = store.lexical_search(text, None, depth=10**6)
            assert_same((ranking.top, ranking.idf_mass), want[text])
            assert store._build is None
        assert "not built, searches stay on FTS5" in caplog.text
    finally:
        moved.rename(path)


@pytest.mark.parametrize("how", ["drop", "close", "release"])
def test_a_build_is_cancelled_cleanly(
    registry,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    collection = registry.create("kb")
    collection.upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    assert collection._store.wait_lexical(timeout=60)
    gate = _Gate(monkeypatch)
    store = collection._store
    assert store.release_connection()
    _check(collection, registry.file_of("kb"), built=False)  # starts a build, held
    assert gate.entered.wait(timeout=60)
    build = store._build
    assert build is not None
    if how == "release":
        assert store.release_connection()
        gate.opened.set()
        assert build.done.wait(timeout=120)
        assert store._postings is None
        _check(collection, registry.file_of("kb"))  # a new build serves
        return
    stop = registry.drop if how == "drop" else registry.close
    stopping = threading.Thread(target=stop, args=("kb",) if how == "drop" else ())
    stopping.start()
    for _ in range(6000):  # the store is closed, then waits for its build
        if store._closed:
            break
        stopping.join(timeout=0.01)
    assert store._closed and store._build is None
    gate.opened.set()
    stopping.join(timeout=120)
    assert not stopping.is_alive() and build.done.is_set()
    assert store._postings is None
    registry._builds.join()
    assert not _builds_alive()
    assert "not built" not in caplog.text


def _stored(data: Path, names: tuple[str, ...]) -> None:
    """Collections of ``TEXTS`` in ``data``, closed again (a server's last run)."""
    first = CollectionRegistry(
        data, model_name="m", dim=DIM, synchronous="OFF", load_calibrator=dict
    )
    first.load()
    for name in names:
        first.create(name).upsert([_doc(f"d{i}", t, i) for i, t in enumerate(TEXTS)])
    first.close()


def test_settle_waits_for_the_builds_opening_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What start-up waits for: the builds ``load`` started, up to the timeout."""
    _stored(tmp_path / "data", ("a", "b"))
    gate = _Gate(monkeypatch)
    reopened = CollectionRegistry(
        tmp_path / "data", model_name="m", dim=DIM, load_calibrator=dict
    )
    reopened.load()  # a's build starts and is held; b's waits for the one builder
    try:
        assert gate.entered.wait(timeout=60)
        assert reopened.settle(0) == ["a", "b"]
        gate.opened.set()
        assert reopened.settle(120) == []
        for name in ("a", "b"):  # their postings serve: no build is started
            assert reopened.get(name).wait_build(0)
            assert reopened.get(name)._store.wait_lexical(timeout=0)
    finally:
        gate.opened.set()
        reopened.close()


@pytest.mark.parametrize(("timeout", "held"), [(0.0, True), (0.5, True), (30.0, False)])
def test_start_up_waits_for_the_lexical_indexes_up_to_its_setting(
    embedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    timeout: float,
    held: bool,
) -> None:
    """A restarted server answers its first searches from its postings, not from
    FTS5 beside a build (``benchmarks/first_request.py``). With the build held past
    ``NORMCAL_LEXICAL_BUILD_WAIT_S`` it serves anyway, names the collection still
    building (a warning; at 0 s, which asks not to wait, an INFO line), and FTS5
    answers its searches."""
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", lexical_build_wait_s=timeout)
    with TestClient(create_app(settings, embedder=embedder)) as client:  # last run
        client.post("/v1/collections", json={"name": "kb"}).raise_for_status()
        documents = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS) if t]
        client.put(
            "/v1/collections/kb/documents", json={"documents": documents}
        ).raise_for_status()
    caplog.set_level(logging.INFO, logger="app.api.lifespan")
    gate = _Gate(monkeypatch)
    opener = threading.Thread(  # unless held, the build goes on once it started
        target=lambda: held or (gate.entered.wait(60) and gate.opened.set())
    )
    opener.start()
    with TestClient(create_app(settings, embedder=embedder)) as client:
        try:
            collection = client.app_state["service"].context.registry.get("kb")
            if held:
                (record,) = [r for r in caplog.records if "still building" in r.message]
                assert "for kb:" in record.message
                assert record.levelname == ("WARNING" if timeout else "INFO")
                assert not collection.wait_build(0)
            else:
                assert collection._store.wait_lexical(timeout=0)  # before any request
                assert "lexical indexes ready" in caplog.text
            r = client.post("/v1/collections/kb/search", json={"query": "fox", "k": 3})
            assert r.status_code == 200 and r.json()["hits"][0]["bm25"] > 0
        finally:  # before the shutdown, which waits for the build
            gate.opened.set()
    opener.join(60)


# FTS5 keeps 32,768 bytes of a token (lexical.MAX_TOKEN_BYTES) and cuts the rest
# byte-wise. At the bound and one past it, with 1- to 4-byte characters: the cut may
# fall inside a character ("a" + 2-byte or 4-byte letters, 3-byte letters).
_LONG = {
    "ascii at": "a" * 32_768,
    "ascii past": "b" * 32_769,
    "2-byte at": "ж" * 16_384,
    "2-byte past": "ж" * 16_385,
    "2-byte past, cut inside": "q" + "ж" * 16_384,
    "3-byte below": "心" * 10_922,  # 32,766 bytes
    "3-byte past, cut inside": "心" * 10_923,  # 32,769 bytes, cut after 2 of 3
    "3-byte past, other tail": "心" * 10_922 + "木",  # another cut token
    "4-byte at": "\U00020000" * 8_192,
    "4-byte past, cut inside": "x" + "\U00020000" * 8_192,
    "diacritics fold to 1 byte": "é" * 16_385,
}


@pytest.mark.parametrize("stemmer", lexical.STEMMERS)
def test_tokens_at_and_past_the_fts5_bound_score_as_fts5(
    stemmer: lexical.Stemmer,
) -> None:
    # FTS5's bound, found empirically: a token keeps its first 32,768 bytes, and the
    # cut is byte-wise (inside a character when it falls there).
    assert lexical.MAX_TOKEN_BYTES == 32_768
    tokens = Tokenizer(stemmer).texts(list(_LONG.values())).terms
    kept = {len(t.encode("utf-8", "surrogateescape")) for t in tokens}
    assert kept == {32_766, 32_768, 16_385}  # "心" * 10922, the cut ones, "e" * 16385
    assert ("心" * 10_922).encode() + "心".encode()[:2] in {
        t.encode("utf-8", "surrogateescape") for t in tokens
    }
    texts = [*TEXTS, *(f"fox {t} beer" for t in _LONG.values())]
    conn = _fts(texts, stemmer)
    postings = Postings.build(conn, stemmer)  # read back without a decode error
    queries = [*_LONG.values(), *(f"{t} fox" for t in _LONG.values())]
    queries += ["心" * 10_924, "ж" * 16_386, "fox beer"]
    for text in queries:
        assert_same(_ranked(postings, text), _reference(conn, text))
    # A document matches its own over-long token, as FTS5 cuts both alike.
    first = len(TEXTS) + 1
    for i, token in enumerate(_LONG.values()):
        assert first + i in _ranked(postings, token)[0].seqs.tolist()
    # Documents written after the build are tokenised by FTS5 the same way.
    added = [(100 + i, t) for i, t in enumerate(_LONG.values())]
    conn.executemany("INSERT INTO documents VALUES (?, ?)", added)
    postings.apply([], added)
    for text in queries:
        assert_same(_ranked(postings, text), _reference(conn, text))


class _CommitFails(store_module.Transaction):
    """A transaction whose COMMIT fails (as on an I/O error): SQLite rolls back."""

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self._conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("disk I/O error (injected)")
        super().__exit__(exc_type, *rest)


class _Injected(Exception):
    pass


def _raise(*_: object, **__: object) -> None:
    raise _Injected


def _failing_sql(mp: pytest.MonkeyPatch, collection: Collection[Any]) -> None:
    """Every insert and delete on ``documents`` fails, on the store's connection only
    (temporary triggers: the file is not changed)."""
    del mp
    with collection._store.connection() as conn:
        for event in ("INSERT", "DELETE"):
            conn.execute(
                f"CREATE TEMP TRIGGER fail_{event} BEFORE {event} ON main.documents"
                " BEGIN SELECT RAISE(ABORT, 'injected'); END"
            )


# Each step of a document write, in order (the last runs after COMMIT), made to fail
# (FAISS's in the collection's index only: the index rebuilt after it works).
_STEPS: dict[str, Callable[[pytest.MonkeyPatch, Collection[Any]], None]] = {
    "sql": _failing_sql,
    "tokens": lambda mp, _: mp.setattr(Postings, "tokens_of", _raise),
    "faiss remove": lambda mp, c: mp.setattr(c.index, "remove", _raise),
    "faiss add": lambda mp, c: mp.setattr(c.index, "add", _raise),
    "commit": lambda mp, _: mp.setattr(store_module, "Transaction", _CommitFails),
    "postings apply": lambda mp, _: mp.setattr(Postings, "apply", _raise),
}


def _state(collection: Collection[dict[str, object]]) -> tuple[object, ...]:
    """Counts in SQLite, FTS5 and FAISS, and a dense and a lexical search."""
    store = collection._store
    probe = unit_vectors(1, 3)
    pool = collection.search(probe, ["fox beer"], 5)[0]
    lexical_top = store.lexical_search("fox beer brewing", None, depth=10).top
    return (
        store.count(),
        store.lexical_count(),
        collection.index.size,
        [(h.document.id, h.document.text) for h in pool.hits],
        lexical_top.seqs.tolist(),
    )


@pytest.mark.parametrize(
    ("write", "step"),
    [("upsert", step) for step in _STEPS]
    + [
        (write, step)
        for write in ("delete", "delete_where", "delete_ids")
        for step in _STEPS
        if step not in ("tokens", "faiss add")  # a delete adds nothing
    ],
)
def test_a_document_write_that_fails_changes_nothing(
    registry, monkeypatch: pytest.MonkeyPatch, step: str, write: str
) -> None:
    collection = registry.create("kb")
    path = registry.file_of("kb")
    collection.upsert([_doc(f"d{i}", t, i, part="a") for i, t in enumerate(TEXTS)])
    _check(collection, path)  # the postings serve
    before = _state(collection)
    writes = {
        "upsert": lambda: collection.upsert(
            [_doc("d7", "replaced: a fox and beer", 40), _doc("new", "fox", 41)]
        ),
        "delete": lambda: collection.delete("d7"),
        "delete_where": lambda: collection.delete_where(where({"part": "a"})),
        "delete_ids": lambda: collection.delete_ids(["d0", "d7"]),
    }
    with monkeypatch.context() as mp:
        _STEPS[step](mp, collection)
        if step == "postings apply":  # after COMMIT: the write stands
            writes[write]()
            # Dropped (rebuilt from the file by the next search, below).
            assert collection._store._postings is None
        else:
            with pytest.raises((_Injected, sqlite3.Error)):
                writes[write]()
    if step == "sql":
        with collection._store.connection() as conn:
            conn.execute("DROP TRIGGER temp.fail_INSERT")
            conn.execute("DROP TRIGGER temp.fail_DELETE")
    if step == "postings apply":
        assert _state(collection) != before
    else:
        assert _state(collection) == before
    store = collection._store
    assert store.count() == store.lexical_count() == collection.index.size
    _check(collection, path)  # postings (rebuilt or kept) agree with FTS5
