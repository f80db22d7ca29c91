"""Ids, tenants and filter values are values: no character of one rewrites a query.

A property test over the characters that break quoted expressions (``' " \\ ] [ ,``,
spaces, the word ``or``, Unicode, control characters, the longest legal id) on every
backend: ``local`` (SQLite: parameterised SQL), ``milvus`` (Milvus Lite 3.x,
per-collection), ``milvus-shared`` (Lite 3.x, the shared layout: the two collections
are tenants of the same Milvus collections, holding the same ids) and
``milvus-engine`` (the C++ engine of milvus-lite 2.5.1, per-collection; it cannot
serve the shared layout, see test_milvus_tenancy.py). Get, patch, delete by id, by
ids and by a filter on such a value each touch exactly their own document, and the
other collection's documents never move.

Random unit vectors stand in for embeddings (no model); the registries are the real
ones. A line break is the one character no Milvus expression can carry on both
engines: refused at write on Milvus (nothing written), stored and found on SQLite.
Milvus Lite 2.x (the engine's front end) cannot store an id holding ``'`` (it pastes
ids into its own SQL): refused at write there, nothing written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.collections.base import CollectionBackend, Registry
from app.collections.registry import CollectionRegistry
from app.exceptions import InvalidRequestError, NotFoundError
from app.schemas.common import DOCUMENT_ID_PATTERN
from tests.collections.conftest import DIM, new_docs, unit_vectors, where
from tests.collections.test_storage_contract import needs_milvus

MAX_ID_CHARS = 256  # Limits.max_id_chars
LONGEST = "\U0001f600" * MAX_ID_CHARS  # 256 characters of 4 UTF-8 bytes: 1 KiB
# Pieces that close a quoted literal, a list or a parenthesis, or add a clause.
PIECES = [
    "'",
    '"',
    "\\",
    "]",
    "[",
    ",",
    " ",
    "or",
    " or ",
    "' or id != '",
    "' or tpk != '",
    '" or id != "',
    "') or ('",
    '"] or tpk != ["',
    "\\'",
    '\\"',
    "é",
    "日本",
    "\U0001f600",
    "\t",
    "\x07",
    "\x7f",
    "\u2028",
    "\x85",
    "%",
    "_",
    "*",
    "/",
    "{x}",
]
BYSTANDERS = ["x", "y", 'by "stander" [or] \\']
_ID = re.compile(DOCUMENT_ID_PATTERN)


def legal(doc_id: str) -> bool:
    """What the API accepts as an id (and, for Milvus, can address)."""
    return bool(_ID.match(doc_id)) and len(doc_id) <= MAX_ID_CHARS


piece = st.sampled_from(PIECES) | st.characters(
    exclude_categories=("Cs",), exclude_characters="\x00\r\n"
)
ids = st.lists(piece, min_size=1, max_size=12).map("".join).filter(legal)
hostile_sets = st.lists(ids, min_size=1, max_size=3, unique=True).filter(
    lambda found: not set(found) & set(BYSTANDERS)
)

BACKENDS = [
    "local",
    pytest.param("milvus", marks=needs_milvus),
    pytest.param("milvus-shared", marks=needs_milvus),
    pytest.param("milvus-engine", marks=[needs_milvus, pytest.mark.slow]),
]


def _load(data: dict[str, Any]) -> Any:
    return data


def open_registry(engine: str, tmp_path: Path, uri: str | None) -> Registry[Any]:
    common: dict[str, Any] = {"model_name": "m", "dim": DIM, "load_calibrator": _load}
    if engine == "local":
        local = CollectionRegistry(tmp_path / "data", synchronous="OFF", **common)
        local.load()
        return local
    from app.collections.milvus_registry import MilvusRegistry

    milvus = MilvusRegistry(
        uri or str(tmp_path / "milvus.db"),
        token="",
        layout="shared" if engine == "milvus-shared" else "per-collection",
        **common,
    )
    milvus.load()
    return milvus


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pair(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[CollectionBackend[Any], CollectionBackend[Any]]]:
    """Collections ``a`` and ``b`` of one backend, each holding :data:`BYSTANDERS`."""
    uri = (
        str(request.getfixturevalue("engine_uri"))
        if engine == "milvus-engine"
        else None
    )
    registry = open_registry(engine, tmp_path, uri)
    a, b = registry.create("a"), registry.create("b")
    for seed, collection in enumerate((a, b)):
        collection.upsert(documents(collection, BYSTANDERS, seed))
    yield a, b
    registry.close()


def documents(collection: CollectionBackend[Any], found: list[str], seed: int) -> Any:
    """``found`` as documents of ``collection``: its name in text and metadata, and
    each id as a metadata value and (prefixed) a metadata key."""
    docs = new_docs(found, seed=seed)
    return [
        replace(
            d,
            text=f"{collection.name} {d.id}",
            metadata={"owner": collection.name, "v": d.id, f"k{d.id}": "y"},
        )
        for d in docs
    ]


def held(collection: CollectionBackend[Any], found: list[str]) -> dict[str, Any]:
    """``id -> (text, metadata)`` of every document of ``found`` stored in ``collection``."""
    return {
        doc_id: (doc.text, doc.metadata)
        for doc_id, doc in collection.get_many(found).items()
    }


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=hostile_sets)
@example(hostile=[LONGEST])
@example(hostile=["O'Brien", "' or id != '", '"] or tpk != ["'])
@example(hostile=["x'", "y\\", 'x"]'])
@example(hostile=["\\][%"])  # the engine read the key k\][% as a path: no match
def test_get_patch_and_delete_touch_exactly_their_own_id(
    engine: str,
    pair: tuple[CollectionBackend[Any], CollectionBackend[Any]],
    hostile: list[str],
) -> None:
    a, b = pair
    if (
        engine == "milvus-engine"
    ):  # Milvus Lite 2.x: ' refused at write, nothing written
        for doc_id in (i for i in hostile if "'" in i):
            with pytest.raises(InvalidRequestError) as refused:
                a.upsert(documents(a, [doc_id], 1))
            assert refused.value.field == "documents.0.id"
        assert a.counts()[0] == b.counts()[0] == len(BYSTANDERS)
        hostile = [i for i in hostile if "'" not in i]
        if not hostile:
            return
    everyone = [*hostile, *BYSTANDERS]
    a.upsert(documents(a, hostile, 1))
    b.upsert(documents(b, hostile, 2))
    before_b = held(b, everyone)
    assert a.counts()[0] == b.counts()[0] == len(everyone)
    # reads: exactly the asked ids, each collection its own texts
    got = held(a, everyone)
    assert got.keys() == set(everyone)
    assert all(text == f"a {i}" for i, (text, _) in got.items())
    assert a.get(hostile[0]).text == f"a {hostile[0]}"
    assert a.missing([*hostile, hostile[0] + "-not-stored"]) == [
        hostile[0] + "-not-stored"
    ]
    # a filter on the value, and on a key made of it, selects its document only
    query = unit_vectors(1, seed=3)
    for raw in ({"v": hostile[0]}, {f"k{hostile[0]}": "y"}):
        (pool,) = a.search(query, [hostile[0]], 10, where(raw))
        assert [h.document.id for h in pool.hits] == [hostile[0]], raw
    # patch one: only it changes, in its own collection
    a.update_metadata([hostile[0]], lambda _id, meta: {**meta, "patched": True})
    after = held(a, everyone)
    assert {i for i, (_, meta) in after.items() if meta.get("patched")} == {hostile[0]}
    assert held(b, everyone) == before_b
    # delete one by id, one by a filter on its value, the rest by ids
    a.delete(hostile[0])
    with pytest.raises(NotFoundError):
        a.get(hostile[0])
    assert held(a, everyone).keys() == set(everyone) - {hostile[0]}
    rest = hostile[1:]
    if rest:
        assert a.delete_where(where({"v": rest[0]})) == 1
        assert a.delete_ids([*rest, "never-stored"]) == len(rest) - 1
    assert held(a, everyone).keys() == set(BYSTANDERS)
    assert a.counts()[0] == len(BYSTANDERS)
    # the other collection (another tenant of the same Milvus collections in the
    # shared layout) holds the same ids, untouched
    assert held(b, everyone) == before_b
    assert b.counts()[0] == len(everyone)
    assert b.delete_ids(hostile) == len(hostile)
    assert held(b, everyone).keys() == set(BYSTANDERS)


def test_a_line_break_in_an_id_is_refused_by_milvus_and_kept_by_sqlite(
    engine: str, pair: tuple[CollectionBackend[Any], CollectionBackend[Any]]
) -> None:
    a, b = pair
    broken = ["line\nbreak", "carriage\rreturn"]
    if engine == "local":
        a.upsert(documents(a, broken, 1))
        assert held(a, broken).keys() == set(broken)
        assert a.delete_ids(broken) == 2
        return
    for doc_id in broken:
        with pytest.raises(InvalidRequestError) as refused:
            a.upsert(documents(a, ["fine", doc_id], 1))
        assert refused.value.field == "documents.1.id"
        for read in (a.get, a.delete):
            with pytest.raises(InvalidRequestError):
                read(doc_id)
    assert held(a, ["fine", *BYSTANDERS]).keys() == set(BYSTANDERS)  # nothing written
    assert a.counts()[0] == b.counts()[0] == len(BYSTANDERS)


@needs_milvus
def test_pymilvus_get_and_delete_by_ids_are_never_called(tmp_path: Path) -> None:
    """They paste ids into an expression: the guarded client refuses them outright."""
    from app.collections.milvus import MilvusStorage

    storage: MilvusStorage[Any] = MilvusStorage(str(tmp_path / "milvus.db"), _load)
    try:
        storage.create("kb", {"model": "m", "dim": DIM, "created_at": 0.0})
        docs = storage.layout.documents("kb", DIM, "flat")
        for call in (
            lambda: storage.client.get(docs, ids=["x' or id != '"]),
            lambda: storage.client.delete(docs, ids=["x' or id != '"]),
        ):
            with pytest.raises(TypeError, match="pastes"):
                call()
        storage.client.delete(docs, filter='id == "x"')  # by a filter: fine
    finally:
        storage.close()
