"""CollectionStore: the SQLite file of one collection, without a model or an index."""

from __future__ import annotations

import os
import stat
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.collections.checks import check_file
from app.collections.connections import OpenConnections
from app.collections.local_state import LocalState
from app.collections.store import CollectionStore
from app.collections.store_files import SCHEMA_VERSION, build_store
from app.exceptions import NotFoundError
from app.schemas.filters import Bounds, parse
from app.settings import Limits
from tests.collections.conftest import DIM, new_docs
from tests.collections.conftest import where as as_filter


def test_build_store_writes_a_private_complete_file_and_never_overwrites(tmp_path):
    path = tmp_path / "kb.sqlite3"
    meta = {"name": "kb", "model": "m", "dim": DIM, "created_at": 1.0}
    build_store(path, meta, synchronous="OFF")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert check_file(path) == {**meta, "schema_version": SCHEMA_VERSION}
    with pytest.raises(FileExistsError):
        build_store(path, {**meta, "dim": 3}, synchronous="OFF")
    assert check_file(path)["dim"] == DIM


def test_upsert_assigns_seqs_and_replacing_gives_a_fresh_one(store):
    removed, first = store.upsert(new_docs(["a", "b", "c"]))
    assert removed == [] and len(set(first)) == 3
    replacement = new_docs(["b"], seed=7, v=2)
    removed, again = store.upsert(replacement)
    assert removed == [first[1]] and again[0] not in first
    assert store.count() == 3
    doc = store.get("b")
    assert doc is not None and doc.seq == again[0] and doc.metadata == {"v": 2}
    assert store.seqs_of(["a", "b", "nope"]) == {"a": first[0], "b": again[0]}


def test_get_returns_what_was_stored(store):
    docs = new_docs(["a", "b"], topic="ünïcode ✓")
    store.upsert(docs)
    got = store.get("b")
    assert got is not None
    assert (got.id, got.text, got.metadata) == (
        "b",
        "text of b",
        {"topic": "ünïcode ✓"},
    )
    assert (got.norm, got.n_tokens, got.truncated) == (2.0, 4, False)
    assert store.get("nope") is None
    by_seq = store.get_by_seqs([got.seq, 10_000])
    assert list(by_seq) == [got.seq] and by_seq[got.seq] == got


def test_delete_returns_the_seq_once(store):
    _, seqs = store.upsert(new_docs(["a", "b"]))
    assert store.delete("a") == seqs[0]
    assert store.delete("a") is None
    assert store.get("a") is None and store.count() == 1


def test_filter_compares_json_types_without_coercion(store):
    store.upsert(new_docs(["s"], v="1"))
    store.upsert(new_docs(["i"], v=1))
    store.upsert(new_docs(["f"], v=1.5))
    store.upsert(new_docs(["b"], v=True))
    store.upsert(new_docs(["n"], v=None))
    store.upsert(new_docs(["q"], **{"a.b [0]": "x"}))
    ids = {d.seq: d.id for d in store.get_by_seqs(range(1, 100)).values()}

    def matching(where):
        return sorted(ids[int(s)] for s in store.filter_seqs(as_filter(where)))

    assert matching({"v": "1"}) == ["s"]
    assert matching({"v": 1}) == ["i"]
    assert matching({"v": 1.5}) == ["f"]
    assert matching({"v": True}) == ["b"]
    assert matching({"v": False}) == []
    assert matching({"v": None}) == ["n"]
    assert matching({"a.b [0]": "x"}) == ["q"]  # a key, not a JSON path
    assert matching({"v": 1, "a.b [0]": "x"}) == []  # every key must match
    assert matching({}) == sorted(ids.values())


def test_filter_on_a_key_with_a_double_quote(store):
    store.upsert(new_docs(["q"], **{'say "hi"': 1}))
    assert store.filter_seqs(as_filter({'say "hi"': 1})).tolist() == [
        store.seqs_of(["q"])["q"]
    ]


def test_the_largest_filter_the_settings_allow_is_one_sqlite_builds(store):
    """``max_filter_keys`` can be set up to 512; SQLite refuses ~990 conditions."""
    (le,) = [
        m.le
        for m in Limits.model_fields["max_filter_keys"].metadata
        if hasattr(m, "le")
    ]
    with pytest.raises(ValidationError):
        Limits(max_filter_keys=le + 1)
    where = {f"k{i}": i for i in range(le)}
    store.upsert(new_docs(["a", "b"], **where))
    store.upsert(new_docs(["c"], seed=1, **(where | {"k0": -1})))
    tree = parse(where, Bounds(max_conditions=le))
    assert len(store.filter_seqs(tree)) == 2
    assert store.delete_where(tree) == [1, 2]


def test_iter_vectors_yields_every_vector_exactly_in_seq_order(store):
    docs = new_docs([f"d{i}" for i in range(5)])
    _, seqs = store.upsert(docs)
    store.delete("d1")
    chunks = list(store.iter_vectors(batch=2))
    assert [len(s) for s, _ in chunks] == [2, 2]
    got_seqs = np.concatenate([s for s, _ in chunks])
    got = np.concatenate([v for _, v in chunks])
    keep = [0, 2, 3, 4]
    assert got_seqs.tolist() == [seqs[i] for i in keep]
    assert got.dtype == np.float32 and got.shape == (4, DIM)
    np.testing.assert_array_equal(got, np.stack([docs[i].vector for i in keep]))


def test_norm_sample(store):
    store.upsert(new_docs(["a", "b", "c"]))
    norms, tokens = store.norm_sample(limit=2)
    assert norms.tolist() == [1.0, 2.0] and tokens.tolist() == [3, 4]


@dataclass(frozen=True)
class Cal:
    """A stored calibrator as storage sees it: an id, a method, its JSON."""

    id: str
    method: str = "platt"
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "method": self.method}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cal:
        return cls(data["id"], data["method"])


def _state(store: CollectionStore) -> LocalState[Cal]:
    """The store's state, reached without a collection's lock."""
    return LocalState("kb", lambda: nullcontext(store), Cal.from_json, {})


def test_judgments_are_appended_in_order(store):
    state = _state(store)
    assert state.judgments() == []
    assert state.add_judgments([("q1", "a", 2), ("q2", "b", 0)]) == 2
    assert state.add_judgments([("q1", "b", 1)]) == 3
    assert state.judgments() == [("q1", "a", 2), ("q2", "b", 0), ("q1", "b", 1)]


def test_calibrators_and_meta(store):
    state = _state(store)
    state.add_calibrator(Cal("c1"), activate=False)
    assert "active_calibrator" not in store.get_meta()
    state.add_calibrator(Cal("c2", "nt"), activate=True)
    assert store.get_meta()["active_calibrator"] == "c2"
    assert state.profile == Cal("c2", "nt")
    assert state.calibrator("c1") == Cal("c1")
    with pytest.raises(NotFoundError):
        state.calibrator("nope")
    assert [c.id for c in state.calibrators()] == ["c1", "c2"]
    store.set_meta(note={"nested": [1, 2]})
    assert store.get_meta()["note"] == {"nested": [1, 2]}


def test_a_closed_store_is_not_found(store):
    store.close()
    with pytest.raises(NotFoundError):
        store.count()


def test_open_connections_close_the_least_recently_used(tmp_path: Path):
    connections = OpenConnections(limit=1)
    stores = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.sqlite3"
        meta = {"name": name, "model": "m", "dim": DIM, "created_at": 0.0}
        build_store(path, meta, synchronous="OFF")
        stores.append(CollectionStore(path, synchronous="OFF", connections=connections))
    a, b = stores
    a.upsert(new_docs(["x"]))
    b.upsert(new_docs(["y", "z"]))
    assert connections.open_count == 1  # a's connection was closed for b's
    assert a.count() == 1 and b.count() == 2  # and a reopens on its next use
    assert connections.open_count == 1
    for s in stores:
        s.close()
    assert connections.open_count == 0
