"""The shared Milvus layout: many normcal collections as tenants of one Milvus collection.

Against the real Milvus Lite 3.x in ``tmp_path``; random unit vectors stand in for
embeddings (see tests/collections/test_milvus.py). Isolation is the point: two
tenants hold the same ids, and nothing done through one may see or change the other.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")

from pymilvus import MilvusClient

from app.collections.milvus import MilvusCollection, MilvusStorage
from app.collections.milvus_layout import (
    KEY,
    SHARED_STATE,
    TENANT,
    Shared,
    tenant_filter,
)
from app.collections.milvus_registry import MilvusRegistry
from app.exceptions import BackendUnsupportedError, ConflictError, NotFoundError
from tests.collections.conftest import DIM, new_docs, unit_vectors, where
from tests.collections.test_filters import INJECTIONS
from tests.collections.test_milvus import Cal, load

META = {"model": "m", "dim": DIM, "created_at": 0.0}
IDS = ["x", "y", "z"]
DOCS_8 = f"nct_docs_flat_{DIM}"


def shared(path: Path, **kwargs: Any) -> MilvusStorage[Cal]:
    return MilvusStorage(str(path / "milvus.db"), load, layout=Shared(), **kwargs)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[MilvusStorage[Cal]]:
    opened = shared(tmp_path)
    yield opened
    opened.close()


def fill(collection: MilvusCollection[Cal], seed: int) -> None:
    """The same ids in every tenant, with the tenant's name in text and metadata."""
    docs = new_docs(IDS, seed=seed, owner=collection.name, topic="t")
    collection.upsert(
        [replace(d, text=f"shared words {collection.name} {d.id}") for d in docs]
    )


@pytest.fixture
def tenants(storage: MilvusStorage[Cal]) -> tuple[MilvusCollection[Cal], ...]:
    pair = tuple(storage.create(name, dict(META)) for name in ("a", "b"))
    for seed, collection in enumerate(pair):
        fill(collection, seed)
    return pair


def owners(collection: MilvusCollection[Cal]) -> set[str]:
    return {d.metadata["owner"] for d in collection.page(0, 100)}


ESCAPES = [
    {"$or": [{"topic": "t"}, {"topic": {"$ne": "t"}}]},
    {"$or": [{"owner": "b"}, {"owner": {"$exists": False}}]},
    {"$not": {"owner": "a"}},
    {"tenant": "b"},
    *({"owner": value} for value in INJECTIONS),
    *({value: "b"} for value in INJECTIONS[:3]),
]


def test_tenants_share_milvus_collections_and_see_only_their_rows(
    storage: MilvusStorage[Cal], tenants: tuple[MilvusCollection[Cal], ...]
) -> None:
    a = tenants[0]
    assert sorted(storage.client.list_collections()) == [DOCS_8, SHARED_STATE]
    assert storage.names() == ["a", "b"]
    for collection in tenants:
        assert collection.counts() == (3, 3, 3)
        assert owners(collection) == {collection.name}
        assert {d.metadata["owner"] for d in collection.get_many(IDS).values()} == {
            collection.name
        }
        assert collection.missing([*IDS, "w"]) == ["w"]
    # the API's ids, not the tenant-prefixed keys
    assert [d.id for d in a.page(0, 100)] == IDS
    assert a.get("x").metadata["owner"] == "a"
    assert len(a.norm_sample()[0]) == 3


def test_no_filter_or_search_reaches_another_tenant(
    tenants: tuple[MilvusCollection[Cal], ...],
) -> None:
    a, _ = tenants
    query = unit_vectors(1, seed=1)  # b's first vector: its best match if visible
    for raw in [{}, *ESCAPES]:
        (pool,) = a.search(query, ["shared words b x"], 6, where(raw))
        assert {h.document.metadata["owner"] for h in pool.hits} <= {"a"}, raw
        assert len(pool.hits) <= 3


def test_deletes_and_updates_stay_in_the_tenant(
    tenants: tuple[MilvusCollection[Cal], ...],
) -> None:
    a, b = tenants
    a.update_metadata(IDS, lambda _id, meta: {**meta, "seen": True})
    assert all("seen" not in d.metadata for d in b.page(0, 100))
    assert a.delete_where(where(ESCAPES[0])) == 3
    assert a.counts()[0] == 0 and b.counts()[0] == 3
    fill(a, 0)
    a.delete("x")
    assert a.delete_ids(["y", "w"]) == 1
    with pytest.raises(NotFoundError):
        a.get("x")
    assert b.get("x").metadata["owner"] == "b"
    assert [d.id for d in b.page(0, 100)] == IDS


def test_state_rows_are_per_tenant(
    tenants: tuple[MilvusCollection[Cal], ...],
) -> None:
    a, b = tenants
    a.state.add_calibrator(Cal("c1"), activate=True)
    a.state.add_judgments([("q", "x", 1)])
    a.state.log_queries(["q"], retention=10, max_chars=100)
    assert b.state.calibrators() == [] and b.state.judgments() == []
    assert b.state.query_log_size() == 0
    b.refresh()
    assert b.state.profile is None and a.state.profile == Cal("c1")
    with pytest.raises(NotFoundError):
        b.state.calibrator("c1")


def test_a_drop_deletes_the_tenants_rows_and_a_new_one_of_the_name_starts_empty(
    storage: MilvusStorage[Cal], tenants: tuple[MilvusCollection[Cal], ...]
) -> None:
    a, b = tenants
    a.state.add_judgments([("q", "x", 1)])
    raw: MilvusClient = storage.client.raw
    storage.drop("a")
    for milvus in (DOCS_8, SHARED_STATE):
        left = raw.query(milvus, filter=tenant_filter("a"), output_fields=[KEY])
        assert left == []
    with pytest.raises(NotFoundError):
        a.refresh()  # what another replica's next request does
    with pytest.raises(NotFoundError):
        storage.drop("a")
    assert storage.names() == ["b"] and b.counts()[0] == 3
    again = storage.create("a", dict(META))
    assert again.counts()[0] == 0 and again.state.judgments() == []
    with pytest.raises(ConflictError):
        storage.create("a", dict(META))


def test_an_interrupted_drop_leaves_nothing_a_new_collection_sees(
    storage: MilvusStorage[Cal], tenants: tuple[MilvusCollection[Cal], ...]
) -> None:
    """Documents whose name row is gone (a drop that stopped half way) are cleared."""
    storage.client.delete(SHARED_STATE, filter=tenant_filter("a"))
    assert storage.names() == ["b"]
    assert storage.create("a", dict(META)).counts()[0] == 0


def test_dimensions_and_index_kinds_get_their_own_shared_collections(
    tmp_path: Path,
) -> None:
    flat = shared(tmp_path)
    flat.create("small", dict(META))
    flat.create("wide", {**META, "dim": 16})
    flat.close()
    hnsw = shared(tmp_path, index_type="hnsw")
    try:
        collection = hnsw.create("graph", dict(META))
        assert collection.index_type == "hnsw"
        assert sorted(hnsw.client.list_collections()) == sorted(
            [DOCS_8, "nct_docs_flat_16", f"nct_docs_hnsw_{DIM}", SHARED_STATE]
        )
        wide = hnsw.open("wide")
        vectors = np.eye(16, dtype=np.float32)[:2]
        docs = new_docs(["p", "q"])
        wide.upsert([replace(d, vector=v) for d, v in zip(docs, vectors, strict=True)])
        (pool,) = wide.search(vectors[:1], ["text"], 1)
        assert [h.document.id for h in pool.hits][:1] == ["p"]
        assert hnsw.open("small").index_type == "flat"
    finally:
        hnsw.close()


def test_rows_carry_the_tenant_as_partition_key(storage: MilvusStorage[Cal]) -> None:
    storage.create("kb", dict(META))
    fields = storage.client.describe_collection(DOCS_8)["fields"]
    by_name = {f["name"]: f for f in fields}
    assert by_name[TENANT].get("is_partition_key") is True
    assert by_name[KEY].get("is_primary") is True
    assert not by_name["id"].get("is_primary")


@pytest.mark.slow
def test_500_collections_in_one_milvus_collection_list_and_reopen(
    tmp_path: Path,
) -> None:
    """Listing and start-up are one query each, whatever the number of collections."""
    names = sorted(f"kb-{i:03d}" for i in range(500))
    storage = shared(tmp_path)
    try:
        for name in names:
            storage.create(name, {**META, "name": name})
        assert sorted(storage.client.list_collections()) == [DOCS_8, SHARED_STATE]
        started = time.perf_counter()
        assert storage.names() == names
        listed = time.perf_counter() - started
    finally:
        storage.close()
    registry: MilvusRegistry[Cal] = MilvusRegistry(
        str(tmp_path / "milvus.db"),
        token="",
        model_name="m",
        dim=DIM,
        load_calibrator=load,
        layout="shared",
    )
    try:
        started = time.perf_counter()
        registry.load()
        loaded = time.perf_counter() - started
        assert registry.names() == names
        assert registry.get("kb-499").meta["dim"] == DIM
    finally:
        registry.close()
    print(f"500 collections: names() {listed:.3f} s, registry load {loaded:.3f} s")


@pytest.mark.slow
def test_a_database_keeps_its_collections_apart(tmp_path: Path) -> None:
    """``NORMCAL_MILVUS_DB``: Milvus Lite 3.x has databases; a missing one is a
    readiness problem naming it."""
    uri = str(tmp_path / "milvus.db")
    admin = MilvusClient(uri=uri)
    admin.create_database("tenants")
    admin.close()
    inside = MilvusStorage(
        uri, load, layout=Shared(), client_options={"db_name": "tenants"}
    )
    try:
        inside.create("kb", dict(META))
        assert inside.names() == ["kb"]
    finally:
        inside.close()
    outside = MilvusStorage(uri, load, layout=Shared())
    try:
        assert outside.names() == [] and outside.client.list_collections() == []
    finally:
        outside.close()
    registry: MilvusRegistry[Cal] = MilvusRegistry(
        uri,
        token="",
        model_name="m",
        dim=DIM,
        load_calibrator=load,
        client_options={"db_name": "absent"},
    )
    registry.load()
    problem = registry.storage_problem()
    assert problem is not None and "database 'absent' does not exist" in problem
    registry.close()


@pytest.mark.slow
def test_an_engine_without_partition_key_filters_refuses_the_shared_layout(
    engine_uri: str,
) -> None:
    """Milvus Lite 2.5.1 (the real engine, Lite's front end) creates a collection
    with a partition key but refuses every filter on it: a 4xx at create, nothing
    left behind."""
    storage = MilvusStorage(engine_uri, load, layout=Shared())
    try:
        with pytest.raises(BackendUnsupportedError, match="partition key"):
            storage.create("kb", dict(META))
        assert storage.client.list_collections() == []
        assert storage.names() == []
    finally:
        storage.close()


def test_the_longest_name_and_id_fit_the_shared_keys(
    storage: MilvusStorage[Cal],
) -> None:
    """A 64-character name (the names' bound) and a 1024-byte id (256 characters of
    4 bytes, the ids' bound) make a primary key within :data:`KEY`'s length."""
    name, doc_id = "n" * 64, "\U0001f600" * 256
    collection = storage.create(name, dict(META))
    (doc,) = new_docs([doc_id])
    collection.upsert([doc])
    assert collection.get(doc_id).id == doc_id
    collection.state.add_calibrator(Cal("c" * 200), activate=True)
    assert storage.open(name).state.profile == Cal("c" * 200)
