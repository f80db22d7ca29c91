"""The filter language: the parser's shapes and bounds, the evaluator's meaning, and
both storage backends agreeing with the evaluator on random documents and trees.

The evaluator (:func:`app.schemas.filters.evaluate`) is pure logic and the oracle;
the SQLite store and the Milvus collection are the real engines. The Milvus property
test shares one collection (each new one waits ~2 s on Milvus's index builds) and is
``slow``, as the Milvus tests beyond the smoke set are.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.collections.base import NewDocument
from app.collections.store import CollectionStore
from app.collections.store_files import build_store
from app.exceptions import FilterTimeoutError
from app.schemas.filters import (
    MATCH_ALL,
    And,
    Bounds,
    Compare,
    Exists,
    FilterBoundError,
    FilterError,
    In,
    Not,
    Or,
    always,
    evaluate,
    parse,
)
from tests.collections.conftest import DIM, new_docs, unit_vectors

HAS_MILVUS = all(importlib.util.find_spec(m) for m in ("pymilvus", "milvus_lite"))


def test_every_operator_parses_to_its_node():
    b = Bounds()
    assert parse({}, b) == MATCH_ALL
    assert parse({"t": "m"}, b) == In("t", ("m",))
    assert parse({"t": {"$eq": None}}, b) == In("t", (None,))
    assert parse({"t": {"$ne": 1}}, b) == Not(In("t", (1,)))
    assert parse({"t": {"$in": ["a", 2]}}, b) == In("t", ("a", 2))
    assert parse({"t": {"$nin": [True]}}, b) == Not(In("t", (True,)))
    for op in ("$gt", "$gte", "$lt", "$lte"):
        assert parse({"y": {op: 2.5}}, b) == Compare("y", op, 2.5)
    assert parse({"x": {"$exists": True}}, b) == Exists("x")
    assert parse({"x": {"$exists": False}}, b) == Not(Exists("x"))
    assert parse({"y": {"$gte": 1, "$lt": "z"}}, b) == And(
        (Compare("y", "$gte", 1), Compare("y", "$lt", "z"))
    )
    assert parse({"$and": [{"a": 1}], "b": 2}, b) == And(
        (And((In("a", (1,)),)), In("b", (2,)))
    )
    assert parse({"$or": [{"a": 1}, {"b": 2}]}, b) == Or((In("a", (1,)), In("b", (2,))))
    assert parse({"$not": {"a": 1}}, b) == Not(In("a", (1,)))
    assert parse({"a.b": 1}, b) == In("a.b", (1,))  # a key, not a path


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ([], "filter", "an object, not an array"),
        ({"$and": {}}, "filter.$and", "non-empty array"),
        ({"$or": []}, "filter.$or", "non-empty array"),
        ({"$and": [{"a": 1}, 3]}, "filter.$and[1]", "an object, not a number"),
        ({"$not": [{"a": 1}]}, "filter.$not", "an object, not an array"),
        ({"$nor": []}, "filter.$nor", "unknown operator '$nor'"),
        ({"a": {"$regex": "x"}}, "filter.a.$regex", "unknown operator '$regex'"),
        ({"a": {}}, "filter.a", "needs an operator"),
        ({"a": [1, 2]}, "filter.a", "not an array"),
        ({"a": {"$eq": {"b": 1}}}, "filter.a.$eq", "not an object"),
        ({"a": {"$in": "x"}}, "filter.a.$in", "takes an array"),
        ({"a": {"$nin": [[1]]}}, "filter.a.$nin[0]", "not an array"),
        ({"a": {"$gt": True}}, "filter.a.$gt", "not a boolean"),
        ({"a": {"$lte": None}}, "filter.a.$lte", "not null"),
        ({"a": {"$exists": 1}}, "filter.a.$exists", "true or false"),
        (
            {"$and": [{"a": 1}, {"$or": [{"y": {"$gt": []}}]}]},
            "filter.$and[1].$or[0].y.$gt",
            "not an array",
        ),
    ],
)
def test_bad_shapes_name_their_json_path(raw: Any, path: str, message: str):
    with pytest.raises(FilterError) as caught:
        parse(raw, Bounds())
    assert caught.value.path == path
    assert message in caught.value.message
    assert not isinstance(caught.value, FilterBoundError)


def _nested(depth: int) -> dict[str, Any]:
    raw: dict[str, Any] = {"a": 1}
    for _ in range(depth - 1):
        raw = {"$not": raw}
    return raw


@pytest.mark.parametrize(
    ("bounds", "at", "past", "path"),
    [
        (Bounds(max_depth=3), _nested(3), _nested(4), "filter.$not.$not.$not"),
        (
            Bounds(max_conditions=4),
            {f"k{i}": i for i in range(4)},
            {f"k{i}": i for i in range(5)},
            "filter.k4",
        ),
        (
            Bounds(max_conditions=4),
            {"$or": [{"a": 1}, {"$not": {"b": {"$gt": 1}}}]},
            {"$or": [{"a": 1}, {"$not": {"b": {"$gt": 1, "$lt": 3}}}]},
            "filter.$or[1].$not.b.$lt",
        ),
        (
            Bounds(max_values=3),
            {"a": {"$in": [1, 2, 3]}},
            {"a": {"$nin": [1, 2, 3, 4]}},
            "filter.a.$nin",
        ),
        (Bounds(max_chars=3), {"a": "xyz"}, {"a": {"$gt": "wxyz"}}, "filter.a.$gt"),
        (Bounds(max_chars=3), {"abc": 1}, {"abcd": 1}, "filter.abcd"),
        (
            Bounds(max_chars=3),
            {"a": {"$in": ["abc"]}},
            {"a": {"$in": ["a", "abcd"]}},
            "filter.a.$in[1]",
        ),
    ],
)
def test_every_bound_holds_at_the_limit_and_refuses_one_past(
    bounds: Bounds, at: dict[str, Any], past: dict[str, Any], path: str
):
    parse(at, bounds)
    with pytest.raises(FilterBoundError) as caught:
        parse(past, bounds)
    assert caught.value.path == path
    assert caught.value.actual == caught.value.limit + 1


@pytest.mark.parametrize(
    "raw",
    [
        {"$or": [{}]},
        {"$and": [{}]},
        {"$not": {}},
        {"$not": {"$not": {}}},
        {"$or": [{"a": 1}, {}]},
        {"$and": [{"a": 1}, {"$or": [{"b": 2}, {"$not": {}}]}]},
    ],
)
def test_an_empty_sub_filter_is_refused_at_parse(raw: dict[str, Any]):
    """``{}`` matches everything: only the whole filter may be empty ("no filter")."""
    with pytest.raises(FilterError, match="empty filter matches every document"):
        parse(raw, Bounds())


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"a": "x\x00y"}, "filter.a"),
        ({"a\x00": 1}, "filter.a\x00"),
        ({"a": {"$in": ["b", "\x00"]}}, "filter.a.$in[1]"),
        ({"$or": [{"a": {"$gt": "\x00"}}]}, "filter.$or[0].a.$gt"),
    ],
)
def test_nul_in_a_key_or_value_is_refused_naming_it(raw: dict[str, Any], path: str):
    with pytest.raises(FilterError, match="NUL") as caught:
        parse(raw, Bounds())
    assert caught.value.path == path


TAUTOLOGIES = [
    {"a": {"$nin": []}},
    {"$not": {"a": {"$in": []}}},
    {"$or": [{"a": 1}, {"a": {"$ne": 1}}]},
    {"$or": [{"a": 1.0}, {"a": {"$ne": 1}}]},  # 1 is 1.0
    {"$or": [{"x": {"$exists": True}}, {"x": {"$exists": False}}]},
    {"$or": [{"a": {"$ne": 1}}, {"a": {"$ne": 2}}]},
    {"$or": [{"a": {"$nin": [1]}}, {"a": {"$in": [1, 2]}}]},
    {"$or": [{"a": {"$nin": [1]}}, {"a": {"$exists": True}}]},
    {"$or": [{"a": {"$exists": False}}, {"a": {"$exists": True}}]},
    {"$not": {"$and": [{"a": 1}, {"a": 2}]}},
    {"$not": {"$and": [{"a": "s"}, {"a": {"$gt": 1}}]}},
    {"$not": {"$and": [{"a": {"$in": [1, 5, "z"]}}, {"a": {"$gt": 5}}]}},
    {"$not": {"$and": [{"a": {"$lt": "s"}}, {"a": {"$gt": 1}}]}},
    {"$not": {"$and": [{"a": {"$gt": 1}}, {"a": {"$exists": False}}]}},
    {"$or": [{"$and": [{"a": 1}, {"b": 1}]}, {"$not": {"$and": [{"a": 1}, {"b": 1}]}}]},
    {"$or": [{"$not": {"$and": [{"a": 1}, {"b": 2}]}}, {"a": 1}]},  # De Morgan
    {"$or": [{"$or": [{"a": 1}, {"c": 3}]}, {"$not": {"a": 1}}]},  # nested, flattened
    {"$not": {"$not": {"$or": [{"a": 1}, {"a": {"$ne": 1}}]}}},
    {
        "$or": [{"a": 1}, {"a": {"$ne": 1}}],
        "c": {"$nin": []},
        "$not": {"a": {"$in": []}},
    },
]
NOT_TAUTOLOGIES = [
    {"a": 1},
    {"a": {"$exists": True}},
    {"a": {"$ne": 1}},
    {"$or": [{"a": {"$gte": 1}}, {"a": {"$lt": 1}}]},  # a missing a fails both
    {"$or": [{"a": True}, {"a": {"$ne": 1}}]},  # true is not 1
    {"$or": [{"a": 1}, {"b": {"$ne": 1}}]},
    {"$or": [{"a": {"$nin": [1, 2]}}, {"a": 1}]},
    {"$or": [{"a": {"$ne": 1}}, {"a": {"$ne": 1.0}}]},
    {"$or": [{"a": {"$exists": False}}, {"a": 1}]},
    {"$not": {"$and": [{"a": 1}, {"b": 2}]}},
    {"$not": {"$and": [{"a": {"$in": [1, 6]}}, {"a": {"$gt": 5}}]}},
]


@pytest.mark.parametrize("raw", TAUTOLOGIES)
def test_tautologies_are_recognised(raw: dict[str, Any]):
    assert always(parse(raw, Bounds())) is True


@pytest.mark.parametrize("raw", NOT_TAUTOLOGIES)
def test_filters_that_can_fail_are_not_taken_for_tautologies(raw: dict[str, Any]):
    assert always(parse(raw, Bounds())) is not True


def test_a_filter_nested_past_the_recursion_limit_is_refused_not_crashed():
    raw: dict[str, Any] = {"a": 1}
    for _ in range(5000):
        raw = {"$not": raw}
    with pytest.raises(FilterBoundError, match="levels"):
        parse(raw, Bounds())


DOC = {"i": 1, "f": 1.0, "b": True, "s": "1", "n": None, "l": [1, "a"], "o": {"x": 1}}


@pytest.mark.parametrize(
    ("raw", "keys"),
    [
        ({"$in": [1]}, {"i", "f"}),  # 1 == 1.0; true is not 1, "1" is not 1
        ({"$in": [True]}, {"b"}),
        ({"$in": ["1"]}, {"s"}),
        ({"$in": [None]}, {"n"}),  # null only where present
        ({"$ne": 1}, {"b", "s", "n", "l", "o", "missing"}),  # a negation: missing too
        ({"$nin": [1, "1"]}, {"b", "n", "l", "o", "missing"}),
        ({"$gte": 1}, {"i", "f"}),  # numbers with numbers; bools are not numbers
        ({"$lt": "2"}, {"s"}),  # strings with strings
        ({"$gt": 0}, {"i", "f"}),
        ({"$exists": True}, set(DOC)),  # null, lists and objects are present
        ({"$exists": False}, {"missing"}),
    ],
)
def test_the_evaluator_keeps_json_types_apart(raw: dict[str, Any], keys: set[str]):
    found = {
        key for key in [*DOC, "missing"] if evaluate(parse({key: raw}, Bounds()), DOC)
    }
    assert found == keys


# Random documents and trees: a few keys, values of every kind that collide across
# types (1, 1.0, true, "1"), lists and objects, and keys left out. Keys and strings
# hold control characters (compared exactly), and keys a JSON path cannot name as
# written ('"', control characters: the store matches them through json_each).
CONTROL = ["\x01", "a\x1f", "a\tb", "\x7f"]
KEYS = ["a", "b", "c", "", 'q"k', "k\x01", "a\nb"]
SCALARS = st.sampled_from(
    [
        0,
        1,
        -2,
        7,
        1.0,
        2.5,
        -0.5,
        True,
        False,
        "",
        "1",
        "a",
        "b",
        "ab",
        "é",
        None,
        *CONTROL,
    ]
)
VALUES = st.one_of(SCALARS, st.sampled_from([[1, "a"], ["b"], {"x": 1}]))
METADATA = st.dictionaries(st.sampled_from([*KEYS, "d"]), VALUES, max_size=4)
ORDERED = st.sampled_from(
    [0, 1, -2, 7, 1.0, 2.5, -0.5, "", "1", "a", "b", "ab", "é", *CONTROL]
)
# The API refuses NUL in metadata and filters; a file written before it did may
# still hold one, and SQLite's JSON functions end a string there ("a\x00b" reads
# "a"): the store must match such rows exactly too.
NUL_VALUES = st.one_of(VALUES, st.sampled_from(["a\x00", "a\x00b", "\x00", "1\x00"]))
NUL_METADATA = st.dictionaries(
    st.sampled_from([*KEYS, "d", "a\x00", "a\x00b"]), NUL_VALUES, max_size=4
)


def _condition() -> st.SearchStrategy[dict[str, Any]]:
    key = st.sampled_from(KEYS)
    op = st.one_of(
        SCALARS,
        st.fixed_dictionaries({"$eq": SCALARS}),
        st.fixed_dictionaries({"$ne": SCALARS}),
        st.fixed_dictionaries({"$in": st.lists(SCALARS, max_size=3)}),
        st.fixed_dictionaries({"$nin": st.lists(SCALARS, max_size=3)}),
        st.fixed_dictionaries({"$gt": ORDERED}),
        st.fixed_dictionaries({"$gte": ORDERED}),
        st.fixed_dictionaries({"$lt": ORDERED}),
        st.fixed_dictionaries({"$lte": ORDERED}),
        st.fixed_dictionaries({"$exists": st.booleans()}),
    )
    return st.builds(lambda k, v: {k: v}, key, op)


FILTERS = st.recursive(
    _condition(),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"$and": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda x: {"$not": x}, inner),
        st.builds(lambda x, y: x | y, inner, inner),  # an implicit $and of keys
    ),
    max_leaves=8,
)
DOCUMENTS = st.lists(METADATA, min_size=1, max_size=10)
NUL_DOCUMENTS = st.lists(NUL_METADATA, min_size=1, max_size=10)
# Always tried: empty lists, and the values that collide across JSON types.
EDGE_DOCUMENTS = [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": None}, {}]
# NUL: a prefix is not the string, in values and in keys.
NUL_EDGE_DOCUMENTS = [{"a": "a\x00b"}, {"a": "a"}, {"a\x00b": "a"}, {"a": "\x00"}]
NUL_EDGE_FILTERS = [
    {"a": "a"},
    {"a": {"$gt": "a"}},
    {"a": {"$lte": ""}},
    {"a": {"$exists": True}},
]
EDGE_FILTERS = [
    {"a": {"$in": []}},
    {"a": {"$nin": []}},
    {"$not": {"a": 1}},
    {"a": {"$gte": 1}},
    {"a": None},
]
LOOSE = Bounds(max_depth=32, max_conditions=1000, max_chars=1 << 20)


def _expected(raw: dict[str, Any], metadatas: list[dict[str, Any]]) -> list[str]:
    tree = parse(raw, LOOSE)
    return [f"d{i}" for i, m in enumerate(metadatas) if evaluate(tree, m)]


def _documents(metadatas: list[dict[str, Any]]) -> list[NewDocument]:
    ids = [f"d{i}" for i in range(len(metadatas))]
    return [
        NewDocument(**{**d.__dict__, "metadata": m})
        for d, m in zip(new_docs(ids), metadatas, strict=True)
    ]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(metadatas=NUL_DOCUMENTS, raws=st.lists(FILTERS, min_size=1, max_size=4))
@example(metadatas=EDGE_DOCUMENTS, raws=EDGE_FILTERS)
@example(metadatas=NUL_EDGE_DOCUMENTS, raws=NUL_EDGE_FILTERS)
def test_sqlite_matches_the_evaluator(
    store: CollectionStore, metadatas: list[dict[str, Any]], raws: list[dict[str, Any]]
):
    store.delete_where(MATCH_ALL)
    store.upsert(_documents(metadatas))
    ids = {d.seq: d.id for d in store.page(0, 100)}
    for raw in raws:
        found = sorted(ids[int(s)] for s in store.filter_seqs(parse(raw, LOOSE)))
        assert found == sorted(_expected(raw, metadatas)), raw
    deleted = store.delete_where(parse(raws[0], LOOSE))
    assert sorted(ids[s] for s in deleted) == sorted(_expected(raws[0], metadatas))


@settings(max_examples=400, deadline=None)
@given(raw=FILTERS, metadatas=st.lists(METADATA, min_size=1, max_size=20))
@example(raw={"$or": [{"a": 1}, {"a": {"$ne": 1}}]}, metadatas=EDGE_DOCUMENTS)
@example(raw={"$or": [{"a": True}, {"a": {"$ne": 1}}]}, metadatas=EDGE_DOCUMENTS)
def test_what_always_proves_the_evaluator_agrees_with(
    raw: dict[str, Any], metadatas: list[dict[str, Any]]
):
    """Soundness: a filter proved true (false) matches every (no) document."""
    tree = parse(raw, LOOSE)
    proved = always(tree)
    if proved is not None:
        assert all(evaluate(tree, m) is proved for m in [*metadatas, {}]), raw


# Hostile strings, as values and as keys, under every operator.
INJECTIONS = [
    'x" or 1==1 or metadata["k"] == "',
    "x' or 1==1 or metadata['k'] == '",
    "x\\",
    'x\\" or true or "',
    "x or 1==1",
    "x) or (1==1",
    'k"]["x',  # the engine (Lite 2.5) cut a key at "][" as a JSON path
    "ünïcödé ✓ 日本語",
    "tab\tnew\nline",
    "control \x01 \x1f \x7f characters",
    "v" * 20_000,
]


def every_operator(key: str, value: str) -> list[dict[str, Any]]:
    """Filters using ``key`` and ``value`` with every operator of the language."""
    return [
        {key: value},
        *({key: {op: value}} for op in ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")),
        {key: {"$in": ["x", value]}},
        {key: {"$nin": [value]}},
        {key: {"$exists": True}},
        {key: {"$exists": False}},
        {"$not": {key: value}},
        {"$or": [{key: "none"}, {key: value}]},
        {"$and": [{key: {"$ne": "none"}}, {key: value}]},
    ]


@pytest.mark.parametrize("value", INJECTIONS)
def test_sqlite_takes_hostile_keys_and_values_literally(store: CollectionStore, value):
    """Every operator, with a hostile value and with a hostile key: bound
    parameters, so the value is a literal and the key a key."""
    metas = [{"k": value}, {"k": "x"}, {"k": value + "y", value: "x"}]
    store.upsert(_documents(metas))
    ids = {d.seq: d.id for d in store.page(0, 10)}
    for raw in every_operator("k", value) + every_operator(value, "x"):
        found = sorted(ids[int(s)] for s in store.filter_seqs(parse(raw, LOOSE)))
        assert found == _expected(raw, metas), raw
    assert [ids[s] for s in store.delete_where(parse({"k": value}, LOOSE))] == ["d0"]


@pytest.fixture(scope="module", params=["milvus", "milvus-engine"])
def milvus_kb(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A collection on Milvus Lite 3.x or on the real engine (its session server)."""
    from tests.collections.test_milvus import META, open_storage

    if request.param == "milvus-engine":
        uri = request.getfixturevalue("milvus_engine")
    else:
        uri = str(tmp_path_factory.mktemp("milvus") / "milvus.db")
    storage = open_storage(uri)
    name = "filters_property"
    yield storage.create(name, {**META, "name": name})
    storage.drop(name)
    storage.close()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MILVUS, reason="milvus-lite is not installed")
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(metadatas=DOCUMENTS, raws=st.lists(FILTERS, min_size=1, max_size=3))
@example(metadatas=EDGE_DOCUMENTS, raws=EDGE_FILTERS)
@example(metadatas=[{"a": "a\x01"}, {"a": "a"}, {"k\x01": "a"}], raws=NUL_EDGE_FILTERS)
def test_milvus_matches_the_evaluator(
    milvus_kb: Any, metadatas: list[dict[str, Any]], raws: list[dict[str, Any]]
):
    milvus_kb.delete_where(MATCH_ALL)
    milvus_kb.upsert(_documents(metadatas))
    query = unit_vectors(1, seed=9)
    for raw in raws:
        (pool,) = milvus_kb.search(query, ["text"], len(metadatas), parse(raw, LOOSE))
        found = sorted(h.document.id for h in pool.hits)
        assert found == sorted(_expected(raw, metadatas)), raw
    assert milvus_kb.delete_where(parse(raws[0], LOOSE)) == len(
        _expected(raws[0], metadatas)
    )
    left = set(milvus_kb.get_many([f"d{i}" for i in range(len(metadatas))]))
    assert left.isdisjoint(_expected(raws[0], metadatas))


# Wide metadata (1,000 keys, ~16 KB a document) and 63 conditions none of which
# rules a document out early: seconds of work here, far more than 10 ms anywhere.
WIDE = {f"key{i:04d}": i for i in range(1000)}
COSTLY = {"$or": [{f"missing{i}": i} for i in range(62)]}


@pytest.fixture(scope="module")
def wide_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection file of 1,000 documents with wide metadata (built once)."""
    path = tmp_path_factory.mktemp("wide") / "wide.sqlite3"
    build_store(
        path,
        {"name": "wide", "model": "m", "dim": DIM, "created_at": 0.0},
        synchronous="OFF",
    )
    store = CollectionStore(path, synchronous="OFF")
    ids = [f"d{i}" for i in range(1000)]
    store.upsert(_documents([WIDE] * len(ids)))
    store.close()
    return path


def test_a_filter_past_its_deadline_is_stopped_and_deletes_nothing(
    wide_file: Path, tmp_path: Path
):
    copy = tmp_path / "wide.sqlite3"
    copy.write_bytes(wide_file.read_bytes())
    store = CollectionStore(copy, synchronous="OFF", filter_timeout_ms=10)
    try:
        tree = parse(COSTLY, Bounds())
        with pytest.raises(FilterTimeoutError) as caught:
            store.filter_seqs(tree)
        assert caught.value.retry_after == 1
        assert "NORMCAL_FILTER_TIMEOUT_MS (10 ms)" in str(caught.value)
        with pytest.raises(FilterTimeoutError):
            store.delete_where(parse({"$not": COSTLY}, Bounds()))
        assert store.count() == 1000  # rolled back
        store.upsert(_documents([{"small": 1}]))  # the connection serves on
    finally:
        store.close()
    unbounded = CollectionStore(copy, synchronous="OFF")
    try:
        assert len(unbounded.filter_seqs(parse({"key0001": 1}, Bounds()))) == 999
    finally:
        unbounded.close()


def test_the_deadline_bounds_the_filters_scan_not_the_deletion_it_selects(
    tmp_path: Path,
):
    """A cheap filter matching many documents is deleted whatever the deletion
    costs (the lexical index's triggers grow with the documents matched): here each
    deleted row costs a millisecond of a trigger, 300 of them 3x the 100 ms deadline."""
    path = tmp_path / "kb.sqlite3"
    build_store(path, {"name": "kb", "model": "m", "dim": DIM}, synchronous="OFF")
    store = CollectionStore(path, synchronous="OFF", filter_timeout_ms=100)
    try:
        store.upsert(_documents([{"t": 1}] * 300 + [{"t": 2}]))
        with store.connection() as conn:
            conn.create_function("slow", 0, lambda: time.sleep(0.001))
            conn.execute(
                "CREATE TEMP TRIGGER slow AFTER DELETE ON documents BEGIN"
                " SELECT slow(); END"
            )
        assert len(store.delete_where(parse({"t": 1}, Bounds()))) == 300
        assert store.count() == 1
    finally:
        store.close()
