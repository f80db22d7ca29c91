"""The Milvus backend on both engines: Milvus Lite 3.x (a file in ``tmp_path``) and
the real C++ engine (milvus-lite 2.5.1's server, tests/support/milvus_engine.py; its
cases are ``slow`` and skip, naming the missing environment, where it is absent).

Random unit vectors stand in for embeddings; the calibrator is a plain JSON holder
(storage never looks inside one). Each new collection waits ~2 s on Milvus's index
builds, so all but a smoke set (the unmarked tests) are ``slow``: in ``make test``,
not in ``make test-fast``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")

from pymilvus import MilvusException

from app.collections import milvus, milvus_client
from app.collections.base import NewDocument
from app.collections.milvus import MilvusCollection, MilvusStorage
from app.collections.milvus_client import (
    MilvusFilter,
    milvus_filter,
    milvus_name,
    normcal_name,
)
from app.exceptions import (
    BackendUnsupportedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StorageUnavailableError,
)
from app.schemas.filters import evaluate
from tests.collections.conftest import DIM, new_docs, unit_vectors, where
from tests.collections.test_filters import INJECTIONS, every_operator
from tests.support.milvus_lite import milvus_lite_server

META = {"name": "kb", "model": "m", "dim": DIM, "created_at": 0.0}


@dataclass(frozen=True)
class Cal:
    """A stored calibrator: an id, a method and some JSON."""

    id: str
    method: str = "platt"
    data: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "method": self.method, "data": self.data}


def load(data: dict[str, Any]) -> Cal:
    return Cal(data["id"], data["method"], data["data"])


ENGINES = ["milvus", pytest.param("milvus-engine", marks=pytest.mark.slow)]


@pytest.fixture(params=ENGINES)
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A Milvus Lite 3.x file, or the real engine's server emptied for this test."""
    if request.param == "milvus-engine":
        return str(request.getfixturevalue("engine_uri"))
    return str(tmp_path / "milvus.db")


def open_storage(uri: str, **options: Any) -> MilvusStorage[Cal]:
    return MilvusStorage(uri, load, **options)


@pytest.fixture
def storage(uri: str) -> Iterator[MilvusStorage[Cal]]:
    opened = open_storage(uri)
    yield opened
    opened.close()


@pytest.fixture
def kb(storage: MilvusStorage[Cal]) -> MilvusCollection[Cal]:
    return storage.create("kb", dict(META))


@pytest.mark.slow
def test_names_map_injectively_to_milvus_names(storage: MilvusStorage[Cal]) -> None:
    names = ["kb", "KB", "a-b", "a_b", "a_db", "a_ub", "a-d", "9-_x", "a" * 64]
    mapped = [milvus_name(n) for n in names]
    assert len(set(mapped)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", m) for m in mapped)
    assert milvus_name("a-b") != milvus_name("a-b", "ncs_")
    # and back (listing a collection being loaded reads its name from its Milvus name)
    assert [normcal_name(m) for m in mapped] == names
    assert normcal_name(milvus_name("é", "ncs_")) == "é"
    assert [normcal_name(m) for m in ("nct_state", "ncd_a_q", "ncd_a_x00zz", "x")] == [
        None
    ] * 4
    for name in ("9-_x", "a_db", "a-b"):
        storage.create(name, {**META, "name": name})
    assert storage.names() == ["9-_x", "a-b", "a_db"]
    with pytest.raises(ConflictError):
        storage.create("a-b", dict(META))
    storage.drop("a-b")
    assert storage.names() == ["9-_x", "a_db"]
    with pytest.raises(NotFoundError):
        storage.open("a-b")


def test_upsert_get_replace_delete_page_count(kb: MilvusCollection[Cal]) -> None:
    ids = [f"d{i}" for i in range(7)]
    kb.upsert(new_docs(ids, tag="x"))
    assert kb.counts() == (7, 7, 7)
    doc = kb.get("d3")
    assert (doc.text, doc.metadata, doc.norm, doc.n_tokens, doc.truncated) == (
        "text of d3",
        {"tag": "x"},
        4.0,
        6,
        False,
    )
    # Replacing is by id: same count, new content, a seq after every other one.
    kb.upsert(new_docs(["d3"], seed=5, tag="y"))
    assert kb.counts()[0] == 7
    assert kb.get("d3").metadata == {"tag": "y"}
    first = kb.page(0, 3)
    rest = kb.page(first[-1].seq, 100)
    assert [d.id for d in first + rest] == ["d0", "d1", "d2", "d4", "d5", "d6", "d3"]
    assert kb.page(rest[-1].seq, 10) == []
    assert kb.missing(["d1", "zz", "zz", "a"]) == ["a", "zz"]
    assert set(kb.get_many(["d1", "d2", "nope"])) == {"d1", "d2"}
    kb.delete("d1")
    with pytest.raises(NotFoundError):
        kb.get("d1")
    with pytest.raises(NotFoundError):
        kb.delete("d1")
    assert kb.delete_where(where({"tag": "y"})) == 1
    assert kb.counts()[0] == 5
    norms, tokens = kb.norm_sample()
    assert sorted(norms.tolist()) == [1.0, 3.0, 5.0, 6.0, 7.0]
    assert sorted(tokens.tolist()) == [3, 5, 7, 8, 9]
    assert kb.delete_where(where({})) == 5
    assert kb.counts() == (0, 0, 0)


def test_search_is_the_exact_top_k_under_a_filter(kb: MilvusCollection[Cal]) -> None:
    docs = new_docs([f"d{i}" for i in range(40)], seed=1)
    docs = [
        NewDocument(**{**d.__dict__, "metadata": {"even": i % 2 == 0, "i": i}})
        for i, d in enumerate(docs)
    ]
    kb.upsert(docs)
    query = unit_vectors(1, seed=9)
    vectors = np.stack([d.vector for d in docs])
    cosine = vectors @ query[0]
    even = [i for i in range(40) if i % 2 == 0]
    expected = sorted(even, key=lambda i: -cosine[i])[:5]
    (pool,) = kb.search(query, ["zzzz"], 5, where({"even": True}))
    hits = [pool.hits[i] for i in pool.dense_top(5)]
    assert [h.document.id for h in hits] == [f"d{i}" for i in expected]
    assert [h.score for h in hits] == pytest.approx(
        [cosine[i] for i in expected], abs=1e-5
    )
    (pool,) = kb.search(query, ["q"], 5, where({"i": 7}))
    assert [h.document.id for h in pool.hits] == ["d7"]
    # 1 is not true, "7" is not 7: JSON types are kept apart as in the SQLite store.
    assert kb.search(query, ["q"], 5, where({"even": 1}))[0].hits == []
    assert kb.search(query, ["q"], 5, where({"i": "7"}))[0].hits == []
    # A null matches a stored null, not a missing key.
    (extra,) = new_docs(["null"], seed=7)
    kb.upsert([NewDocument(**{**extra.__dict__, "metadata": {"even": None}})])
    assert [
        h.document.id
        for h in kb.search(query, ["q"], 50, where({"even": None}))[0].hits
    ] == ["null"]
    assert kb.search(query, ["q"], 50, where({"missing": None}))[0].hits == []
    # A filter Milvus cannot apply exactly is resolved first: still the exact top k.
    odd = sorted((i for i in range(40) if i % 2), key=lambda i: -cosine[i])[:5]
    (pool,) = kb.search(
        query, ["zzzz"], 5, where({"$not": {"even": {"$in": [True, None]}}})
    )
    assert [pool.hits[i].document.id for i in pool.dense_top(5)] == [
        f"d{i}" for i in odd
    ]
    assert kb.search(query, ["q"], 5, where({"i": {"$gt": 99}}))[0].hits == []


def test_lexical_part_of_the_pool_comes_from_milvus_bm25(
    kb: MilvusCollection[Cal],
) -> None:
    docs = new_docs([f"d{i}" for i in range(20)], seed=2)
    docs[13] = NewDocument(**{**docs[13].__dict__, "text": "zebra crossing rules"})
    kb.upsert(docs)
    far = -docs[13].vector[None, :]  # d13 is the dense *last*
    (pool,) = kb.search(far, ["zebra rules"], 3)
    assert pool.n_dense == 3
    (best,) = pool.lexical_top(1)
    assert pool.hits[best].document.id == "d13"
    assert pool.hits[best].score == pytest.approx(-1.0, abs=1e-5)  # its cosine
    assert pool.lexical.bm25[best] > 0 and pool.lexical.top == pool.lexical.bm25[best]
    assert pool.lexical.rank[best] == 1.0
    assert pool.lexical.idf_mass > 0


@pytest.mark.slow
def test_pages_stay_in_seq_order_when_a_window_is_full(
    kb: MilvusCollection[Cal], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query window smaller than the collection forces the narrowing rounds."""
    monkeypatch.setattr(milvus, "_QUERY_WINDOW", 4)
    ids = [f"p{i:02d}" for i in range(23)]
    for start in range(0, len(ids), 5):
        kb.upsert(new_docs(ids[start : start + 5], seed=start))
    kb.upsert(new_docs(["p03"], seed=99))  # replaced: now the newest
    seen: list[str] = []
    after = 0
    for _ in range(len(ids)):  # bounded: one page of 3 at a time
        page = kb.page(after, 3)
        if not page:
            break
        assert [d.seq for d in page] == sorted(d.seq for d in page)
        seen += [d.id for d in page]
        after = page[-1].seq
    assert seen == [i for i in ids if i != "p03"] + ["p03"]


@pytest.mark.slow
def test_a_batch_of_queries_is_one_pool_each_and_writes_refresh_idf(
    kb: MilvusCollection[Cal],
) -> None:
    docs = new_docs([f"d{i}" for i in range(10)], seed=4)
    docs[2] = NewDocument(**{**docs[2].__dict__, "text": "zebra crossing"})
    kb.upsert(docs)
    vectors = np.stack([docs[2].vector, docs[5].vector])
    zebra, blank = kb.search(vectors, ["zebra", "!!"], 3)
    assert zebra.hits[zebra.lexical_top(1)[0]].document.id == "d2"
    assert blank.lexical.idf_mass == 0 and blank.lexical_order == []
    assert blank.hits[0].document.id == "d5"
    # Every document now holds the term: its IDF falls to Milvus's (not FTS5's
    # floor), the IDF of the BM25 scores it normalises.
    kb.upsert([NewDocument(**{**d.__dict__, "text": "zebra crossing"}) for d in docs])
    (again,) = kb.search(vectors[:1], ["zebra"], 3)
    assert again.lexical.idf_mass == pytest.approx(np.log1p(0.5 / 10.5))
    assert zebra.lexical.idf_mass > 1


@pytest.mark.slow
@pytest.mark.parametrize("n_docs", [2, 3, 12])
def test_lex_is_a_share_of_a_perfect_match_however_common_the_terms(
    kb: MilvusCollection[Cal], n_docs: int
) -> None:
    """BM25 over the IDF mass stays within k1 + 1 = 2.2, as on the local backend.

    The mass once used FTS5's IDF (floored at 1e-6 for a term in half the documents)
    under Milvus's BM25 (whose IDF stays positive): in a two-document collection a
    match scored lex ~1e6, and the default profile answered a probability of 1.0.
    """
    texts = ["aspirin lowers the risk of heart attack", "radio waves in the sky"]
    docs = new_docs([f"d{i}" for i in range(n_docs)], seed=n_docs)
    kb.upsert(
        [
            NewDocument(**{**d.__dict__, "text": texts[i % 2]})
            for i, d in enumerate(docs)
        ]
    )
    for query in ["heart attack", "the risk of radio waves", "sky"]:
        (pool,) = kb.search(docs[0].vector[None, :], [query], n_docs)
        assert pool.lexical.top > 0
        assert np.all(pool.lexical.bm25 <= 2.2 * pool.lexical.idf_mass + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("value", INJECTIONS)
def test_filter_values_match_literally_and_never_widen(
    kb: MilvusCollection[Cal], value: str
) -> None:
    """Every operator, with a hostile value and with a hostile key, selects what
    the evaluator says: the value is a literal, the key a key."""
    docs = new_docs(["hit", "other", "third"], seed=3)
    metas = [{"k": value}, {"k": "x"}, {"k": value + "y", value: "x"}]
    kb.upsert(
        [
            NewDocument(**{**d.__dict__, "metadata": m})
            for d, m in zip(docs, metas, strict=True)
        ]
    )
    query = unit_vectors(1, seed=4)
    for raw in every_operator("k", value) + every_operator(value, "x"):
        tree = where(raw)
        expected = sorted(
            d.id for d, m in zip(docs, metas, strict=True) if evaluate(tree, m)
        )
        (pool,) = kb.search(query, ["text"], 10, tree)
        assert sorted(h.document.id for h in pool.hits) == expected, raw
    assert kb.delete_where(where({value: "y"})) == 0
    assert kb.delete_where(where({"k": value})) == 1
    assert kb.missing(["hit", "other", "third"]) == ["hit"]


def test_what_milvus_cannot_write_is_left_to_python() -> None:
    """A value with a control character, an empty or too long $in, a too long
    expression: the pre-filter selects everything (inexact), the evaluator decides."""
    everything = MilvusFilter("", exact=False)
    assert milvus_filter(where({"k": {"$gt": "a\x1fb"}})) == everything
    assert milvus_filter(where({"$or": [{"k\x01": 1}, {"j": 2}]})) == everything
    assert milvus_filter(where({"k][": "y"})) == everything  # not a key to the engine
    assert milvus_filter(where({"k": {"$in": [1, 2**64]}})) == everything
    assert milvus_filter(where({"k": {"$lt": float("nan")}})) == everything
    at = [f"v{i}" for i in range(milvus_client._MAX_IN_VALUES)]
    assert milvus_filter(where({"k": {"$in": at}})).exact
    assert milvus_filter(where({"k": {"$in": [*at, "w"]}})) == everything
    assert milvus_filter(where({"k": {"$in": []}})) == everything
    long = "v" * milvus_client._MAX_EXPR_CHARS
    assert milvus_filter(where({"k": long})) == everything
    assert milvus_filter(where({"k": long[:-100], "j": "x"})).exact
    assert milvus_filter(where({"k": "x", "n": 1})) == MilvusFilter(
        '(metadata["k"] == "x") and (metadata["n"] == 1)', exact=False
    )


@pytest.mark.slow
def test_state_is_shared_through_milvus_and_survives_a_reopen(uri: str) -> None:
    storage = open_storage(uri)
    kb = storage.create("kb", dict(META))
    kb.upsert(new_docs(["a", "b", "c"]))
    kb.set_meta(query_log={"enabled": True})
    kb.state.add_calibrator(Cal("c1", data={"w": [1, 2]}), activate=False)
    kb.state.add_calibrator(Cal("c2"), activate=True)
    assert kb.state.add_judgments([("q1", "a", 1), ("q2", "b", 0)]) == 2
    assert kb.state.add_judgments([("q1", "c", 0)]) == 3
    kb.state.log_queries(["q3", "q4", "q3"], retention=10, max_chars=100)
    assert kb.state.add_judging_queries(["u1", "u2", "u1"]) == 2
    assert kb.state.add_judging_queries(["u2"]) == 0
    query = unit_vectors(1, seed=6)
    before = kb.search(query, ["text of a"], 3)
    storage.close()

    storage = open_storage(uri)
    again = storage.open("kb")
    assert again.meta["query_log"] == {"enabled": True}
    assert again.meta["dim"] == DIM and again.meta["active_calibrator"] == "c2"
    assert again.state.profile == Cal("c2")
    assert [c.id for c in again.state.calibrators()] == ["c1", "c2"]
    assert again.state.calibrator("c1").data == {"w": [1, 2]}
    assert again.state.judgments() == [("q1", "a", 1), ("q2", "b", 0), ("q1", "c", 0)]
    page = again.state.judgments_page(2, 0)
    assert [r[1:4] for r in page] == [("q1", "a", 1), ("q2", "b", 0)]
    assert [r[1:4] for r in again.state.judgments_page(2, page[-1][0])] == [
        ("q1", "c", 0)
    ]
    assert again.state.query_log_size() == 2
    assert again.state.judging_candidates(1) == ("uploaded", ["u1"], 2)
    assert again.state.judging_counts() == (2, 1, 0)
    (after,) = again.search(query, ["text of a"], 3)
    assert [h.document for h in after.hits] == [h.document for h in before[0].hits]
    assert [h.score for h in after.hits] == pytest.approx(
        [h.score for h in before[0].hits]
    )
    storage.close()


def test_calibrators_judging_and_log(kb: MilvusCollection[Cal]) -> None:
    kb.state.add_calibrator(Cal("c1"), activate=True)
    with pytest.raises(ConflictError, match="active one"):
        kb.state.delete_calibrator("c1")
    with pytest.raises(NotFoundError):
        kb.state.activate("nope")
    kb.state.deactivate()
    assert kb.state.profile is None and "active_calibrator" not in kb.meta
    kb.state.delete_calibrator("c1")
    with pytest.raises(NotFoundError):
        kb.state.delete_calibrator("c1")
    kb.state.log_queries(["a", "b", "a"], retention=10, max_chars=100)
    kb.state.log_queries(["c"], retention=10, max_chars=100)
    assert kb.state.judging_candidates(10) == ("log", ["a", "c", "b"], 3)
    assert kb.state.trim_query_log(2) == 2
    assert kb.state.query_log_size() == 2
    assert kb.state.skip_judging("c") is True
    assert kb.state.skip_judging("never-seen") is False
    kb.state.add_judgments([("a", "d", 2), ("b", "d", 0)])
    assert kb.state.judging_candidates(10) == ("none", [], 0)
    assert kb.state.judging_counts() == (2, 1, 1)
    assert kb.state.delete_judgments("a") == 1
    assert kb.state.judgments() == [("b", "d", 0)]
    assert kb.state.delete_judgments(None) == 1
    assert kb.state.delete_judgments(None) == 0


@pytest.fixture(params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A server several clients share: ``milvus-lite server`` (3.x) on a free
    loopback port, or the real engine's; its URI once it answers."""
    if request.param == "milvus-engine":
        yield request.getfixturevalue("engine_uri")
        return
    with milvus_lite_server(tmp_path / "server") as uri:
        yield uri


@pytest.mark.slow
def test_two_clients_of_one_server_share_documents_and_state(server: str) -> None:
    first: MilvusStorage[Cal] = MilvusStorage(server, load)
    second: MilvusStorage[Cal] = MilvusStorage(server, load)
    try:
        kb = first.create("kb", dict(META))
        kb.upsert(new_docs(["a", "b"]))
        kb.state.add_calibrator(Cal("c1"), activate=True)
        other = second.open("kb")
        assert other.state.profile == Cal("c1")
        assert other.get("b").id == "b"
        other.state.add_judgments([("q", "a", 1)])
        other.upsert(new_docs(["c"], seed=8))
        assert kb.state.judgments() == [("q", "a", 1)]
        assert kb.counts()[0] == 3
        assert second.names() == first.names() == ["kb"]
    finally:
        first.close()
        second.close()


@pytest.mark.slow
def test_text_is_stored_up_to_milvus_varchar_bound(kb: MilvusCollection[Cal]) -> None:
    (doc,) = new_docs(["long"])
    at_bound = "é" * (65_535 // 2) + "a"  # 65535 UTF-8 bytes
    kb.upsert([NewDocument(**{**doc.__dict__, "text": at_bound})])
    assert kb.get("long").text == at_bound
    with pytest.raises(InvalidRequestError, match="at most 65535 bytes"):
        kb.upsert([NewDocument(**{**doc.__dict__, "text": at_bound + "a"})])
    assert kb.get("long").text == at_bound


@pytest.mark.slow
def test_hnsw_serves_where_the_engine_builds_it_and_is_refused_where_not(
    uri: str,
) -> None:
    """Milvus Lite 3.x builds HNSW; the engine (Lite 2.5) only FLAT and IVF_FLAT:
    a 422 naming the index and the engine, and nothing left behind."""
    storage = open_storage(uri, index_type="hnsw")
    try:
        if uri.startswith("http"):
            with pytest.raises(BackendUnsupportedError) as refusal:
                storage.create("kb", dict(META))
            assert "the HNSW vector index" in str(refusal.value)
            assert "Milvus Lite 2.x" in str(refusal.value)
            assert storage.client.list_collections() == []
            return
        kb = storage.create("kb", dict(META))
        docs = new_docs([f"d{i}" for i in range(30)], seed=11)
        kb.upsert(docs)
        assert kb.index_type == "hnsw" and storage.open("kb").index_type == "hnsw"
        (pool,) = kb.search(docs[17].vector[None, :], ["x"], 1)
        assert pool.hits[0].document.id == "d17"
    finally:
        storage.close()


def _refusing_bm25(raw: Any) -> None:
    """Make ``raw`` answer a create with a BM25 function as Milvus 2.4 would."""
    create = raw.create_collection

    def refuse(name: str, **kwargs: Any) -> None:
        if kwargs.get("schema") is not None and kwargs["schema"].functions:
            raise MilvusException(1100, "function type BM25 is not supported")
        create(name, **kwargs)

    raw.create_collection = refuse


@pytest.mark.slow
def test_an_engine_without_bm25_is_refused_at_create_naming_it_and_its_version(
    storage: MilvusStorage[Cal],
) -> None:
    """The refusal is the server's answer (faked here: no engine of this suite lacks
    BM25); everything else is the real engine's."""
    _refusing_bm25(storage.client.raw)
    with pytest.raises(BackendUnsupportedError) as refusal:
        storage.create("kb", dict(META))
    message = str(refusal.value)
    assert "BM25 full-text search" in message and "not supported" in message
    assert re.search(r"version milvus_lite-3\.|Milvus Lite 2\.x", message)
    assert storage.client.list_collections() == [] and storage.names() == []


@pytest.mark.slow
def test_a_create_failing_part_way_leaves_nothing_behind(
    storage: MilvusStorage[Cal], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Milvus stops answering after the documents' collection is made."""

    def outage(*args: Any) -> None:
        raise StorageUnavailableError("Milvus at test is unavailable", retry_after=5)

    monkeypatch.setattr(milvus, "create_state_collection", outage)
    with pytest.raises(StorageUnavailableError):
        storage.create("kb", dict(META))
    assert storage.client.list_collections() == []
    monkeypatch.undo()
    assert storage.create("kb", dict(META)).counts() == (0, 0, 0)


@pytest.mark.parametrize(
    "token",
    ["心" * 10_922, "心" * 10_923, "x" + "\U00020000" * 8_192, "é" * 16_385],
    ids=["3-byte at", "3-byte past", "4-byte past", "2-byte folded"],
)
@pytest.mark.slow
def test_a_token_past_fts5s_bound_is_written_and_searched(
    kb: MilvusCollection[Cal], token: str
) -> None:
    """No 32,768-byte cut here (Milvus's analyzer is its own); nothing may fail."""
    docs = new_docs(["long", "short"])
    docs[0] = NewDocument(**{**docs[0].__dict__, "text": f"zebra {token}"})
    kb.upsert(docs)
    assert kb.counts() == (2, 2, 2)
    (pool,) = kb.search(unit_vectors(1, 5), [token], 2)
    (both,) = kb.search(unit_vectors(1, 5), [f"{token} zebra"], 2)
    assert [both.hits[i].document.id for i in both.lexical_top(1)] == ["long"]
    assert pool.lexical.idf_mass >= 0


@pytest.mark.slow
@pytest.mark.parametrize("holding", [3, 4, 5, 23])
def test_document_frequencies_are_exact_past_the_search_cap(
    kb: MilvusCollection[Cal], monkeypatch: pytest.MonkeyPatch, holding: int
) -> None:
    """A search lists at most ``_TOP_K`` hits (16,384 on Milvus; 4 here): a term in
    as many documents, or more, is counted by splitting the seqs, still exactly;
    every term of a search is counted in one call."""
    monkeypatch.setattr(milvus, "_TOP_K", 4)
    docs = new_docs([f"d{i:02d}" for i in range(30)], seed=12)
    kb.upsert(
        [
            NewDocument(**{**d.__dict__, "text": "zebra" if i < holding else "okapi"})
            for i, d in enumerate(docs)
        ]
    )
    assert kb._count_terms(["zebra", "okapi", "absent", ""]) == {
        "zebra": holding,
        "okapi": 30 - holding,
        "absent": 0,
        "": 30,
    }
    (pool,) = kb.search(unit_vectors(1, 3), ["zebra"], 3)
    assert pool.lexical.idf_mass == pytest.approx(
        np.log1p((30 - holding + 0.5) / (holding + 0.5))
    )


@pytest.mark.slow
def test_a_search_counting_terms_holds_no_lock_of_its_collection(
    kb: MilvusCollection[Cal],
) -> None:
    """Issue 33, finding 6: while one search counts its terms' document frequencies
    in Milvus (held here at a gate), a write and another search of the same
    collection are served, and the held search answers once its count ends."""
    kb.upsert(new_docs(["a", "b"], seed=4))
    counting, release = threading.Event(), threading.Event()
    real = kb._terms._count

    def gated(terms: list[str]) -> dict[str, int]:
        if "fresh" in terms:  # the held search's count; others count at once
            counting.set()
            assert release.wait(120)
        return real(terms)

    kb._terms._count = gated
    held: list[Any] = []
    search = threading.Thread(
        target=lambda: held.extend(kb.search(unit_vectors(1, 2), ["fresh"], 2))
    )
    search.start()
    try:
        assert counting.wait(120)
        kb.upsert(new_docs(["c"], seed=5))  # the write lock: no reader holds it
        (other,) = kb.search(unit_vectors(1, 3), ["text"], 3)
        assert {h.document.id for h in other.hits} == {"a", "b", "c"}
    finally:
        release.set()
        search.join(120)
    assert not search.is_alive()
    (pool,) = held
    assert len(pool.hits) == 2
