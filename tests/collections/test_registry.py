"""CollectionRegistry and Collection: create, get, drop, names, reopen (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.collections.registry import CollectionRegistry
from app.exceptions import ConflictError, InvalidRequestError, NotFoundError
from tests.collections.conftest import DIM, new_docs, unit_vectors, where


def _registry(data: Path, model: str = "m", **kw) -> CollectionRegistry:
    # No calibrators here: stored profile JSON stays a plain dict.
    registry = CollectionRegistry(
        data, model_name=model, dim=DIM, synchronous="OFF", load_calibrator=dict, **kw
    )
    registry.load()
    return registry


@pytest.fixture
def registry(tmp_path: Path):
    opened = _registry(tmp_path / "data")
    yield opened
    opened.close()


def test_create_get_names(registry):
    assert registry.names() == []
    created = registry.create("kb", extra="x")
    assert registry.get("kb") is created and registry.names() == ["kb"]
    assert created.meta["model"] == "m" and created.meta["dim"] == DIM
    assert created.meta["extra"] == "x"
    assert (registry.data_dir / "kb.sqlite3").is_file()
    assert created.counts() == (0, 0, 0)
    with pytest.raises(NotFoundError):
        registry.get("nope")


def test_names_are_unique_whatever_their_case(registry):
    registry.create("kb")
    for taken in ("kb", "KB", "Kb"):
        with pytest.raises(ConflictError):
            registry.create(taken)
    assert registry.names() == ["kb"]


@pytest.mark.parametrize("name", ["", "../x", "a.b", "-a", "a" * 65, "con", "LPT1"])
def test_bad_names_are_refused_and_create_nothing(registry, name):
    with pytest.raises(InvalidRequestError):
        registry.create(name)
    assert list(registry.data_dir.iterdir()) == []


def test_drop_removes_the_files_and_the_name(registry):
    collection = registry.create("kb")
    collection.upsert(new_docs(["a"]))
    registry.drop("kb")
    assert registry.names() == [] and list(registry.data_dir.iterdir()) == []
    with pytest.raises(NotFoundError):
        registry.get("kb")
    with pytest.raises(NotFoundError):
        registry.drop("kb")
    with pytest.raises(NotFoundError):
        collection.counts()  # a holder of the dropped collection gets 404 too
    registry.create("KB")  # the name is free again, in any case


def _dense(collection, vectors, k, raw=None):
    """Dense top-k per query vector (no query text, so no lexical candidates)."""
    pools = collection.search(vectors, [""] * len(vectors), k, where(raw or {}))
    return [[pool.hits[j] for j in pool.dense_top(k)] for pool in pools]


def test_collection_upsert_search_delete(registry):
    collection = registry.create("kb")
    docs = new_docs(["a", "b", "c"], topic="t")
    docs += new_docs(["d"], seed=1, topic="u")
    collection.upsert(docs)
    query = np.stack([docs[1].vector])
    [hits] = _dense(collection, query, 2)
    assert hits[0].document.id == "b" and len(hits) == 2
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    [hits] = _dense(collection, query, 5, {"topic": "u"})
    assert [h.document.id for h in hits] == ["d"]
    collection.delete("b")
    with pytest.raises(NotFoundError):
        collection.delete("b")
    with pytest.raises(NotFoundError):
        collection.get("b")
    [hits] = _dense(collection, query, 5)
    assert "b" not in [h.document.id for h in hits]
    assert collection.counts() == (3, 3, 3)
    assert collection.missing(["a", "b", "zz", "a"]) == ["b", "zz"]


def test_reopen_serves_the_same_collection(tmp_path):
    data = tmp_path / "data"
    first = _registry(data)
    collection = first.create("kb")
    docs = new_docs([f"d{i}" for i in range(6)])
    collection.upsert(docs)
    collection.upsert(new_docs(["d0"], seed=5))  # replaced: one vector, not two
    collection.delete("d3")
    collection.state.add_judgments([("q", "d1", 1)])
    queries = unit_vectors(4, seed=9)
    before = [[h.document.id for h in row] for row in _dense(collection, queries, 3)]
    first.close()
    again = _registry(data, index_type="hnsw")
    reopened = again.get("kb")
    assert again.names() == ["kb"] and reopened.counts() == (5, 5, 5)
    assert reopened.state.judgments() == [("q", "d1", 1)]
    after = [[h.document.id for h in row] for row in _dense(reopened, queries, 3)]
    assert after == before
    again.close()


def test_another_models_collection_is_listed_but_not_compatible(tmp_path):
    data = tmp_path / "data"
    _registry(data, model="old-model").create("kb")
    registry = _registry(data, model="new-model")
    assert registry.names() == ["kb"]
    assert registry.get("kb").meta["model"] == "old-model"
    with pytest.raises(ConflictError):
        registry.get_compatible("kb")


def test_load_removes_unfinished_creates_and_ignores_other_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / ".kb.creating-1234.sqlite3").write_bytes(b"half")
    (data / "notes.txt").write_text("mine")
    registry = _registry(data)
    assert registry.names() == [] and registry.unavailable() == []
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]
