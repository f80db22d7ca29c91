"""Poison input (issue 10, defects 2, 3 and the input half of 9) through the real stack.

Each attack is refused with a 422 problem+json naming the field, and nothing is
stored: the collection's document count, a GET of the id and the stored judgments
are unchanged, and the collection stays readable and searchable afterwards. Bodies
are sent as raw JSON text where Python's encoder cannot write them (``NaN``,
``1e400``, ``"\\ud800"``, 10,000 levels of nesting).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from normcal_client import Judgment, NormcalClient

from app.api.app import create_app
from app.schemas.calibrators import MAX_RELEVANCE
from app.settings import Limits, Settings
from tests.conftest import assert_problem

# What the model makes of a text does not matter here: the deterministic fake.
pytestmark = pytest.mark.fake_embedder

DOCS = "/v1/collections/kb/documents"
SEARCH = "/v1/collections/kb/search"
INT64_MAX = 2**63 - 1
DEPTH = Limits().max_metadata_depth  # the shipped default


def _with_kb(client: TestClient) -> TestClient:
    """The app with one collection, ``kb``, holding one document, ``seed``."""
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    seed = {"id": "seed", "text": "Paris is the capital of France.", "metadata": {}}
    assert client.put(DOCS, json={"documents": [seed]}).status_code == 200
    return client


@pytest.fixture
def kb(client: TestClient) -> TestClient:
    """The real app (fake embedder) with the collection ``kb``."""
    return _with_kb(client)


@pytest.fixture
def model_kb(tmp_path: Path, real_embedder: Any) -> Iterator[TestClient]:
    """``kb`` served by the real model, whose default profile answers
    ``min_probability``."""
    settings = Settings(data_dir=tmp_path / "model-kb")
    with TestClient(create_app(settings, embedder=real_embedder)) as client:
        yield _with_kb(client)


def _raw(c: TestClient, method: str, path: str, body: str) -> Any:
    return c.request(
        method,
        path,
        content=body.encode(),
        headers={"content-type": "application/json"},
    )


def _count(c: TestClient) -> int:
    return int(c.get("/v1/collections/kb").json()["documents"])


def _nested(depth: int, leaf: object = "leaf") -> dict[str, Any]:
    """Metadata ``depth`` containers deep, alternating objects and lists."""
    value: object = leaf
    for level in range(depth - 1, 0, -1):
        value = [value, level] if level % 2 else {"k": value, "n": level}
    return {"top": value}


def _refused_upsert(c: TestClient, doc_json: str, field: str) -> dict[str, Any]:
    """PUT one raw document; assert a 422 naming ``field`` and that nothing changed."""
    before = _count(c)
    body = assert_problem(_raw(c, "PUT", DOCS, f'{{"documents": [{doc_json}]}}'), 422)
    assert body["detail"].startswith(field), body
    assert _count(c) == before
    assert_problem(c.get(f"{DOCS}/poison"), 404)
    _assert_healthy(c)
    return body


def _assert_healthy(c: TestClient) -> None:
    """Reads and filtered searches of the collection still work."""
    assert c.get(f"{DOCS}/seed").status_code == 200
    r = c.post(SEARCH, json={"query": "capital of France", "filter": {"x": 1}})
    assert r.status_code == 200, r.text
    r = c.post(SEARCH, json={"query": "capital of France", "k": 100})
    assert r.status_code == 200, r.text


# -- defect 2: depth ------------------------------------------------------------------
def test_metadata_at_the_depth_limit_is_stored_read_and_searched(kb):
    metadata = _nested(DEPTH)
    doc = {"id": "deep", "text": "The Eiffel tower is in Paris.", "metadata": metadata}
    assert kb.put(DOCS, json={"documents": [doc]}).status_code == 200
    got = kb.get(f"{DOCS}/deep")
    assert got.status_code == 200, got.text
    assert got.json()["metadata"] == metadata
    r = kb.post(SEARCH, json={"query": "Eiffel tower Paris", "k": 2})
    assert r.status_code == 200, r.text
    hits = {h["id"]: h["metadata"] for h in r.json()["hits"]}
    assert hits["deep"] == metadata

    body = _refused_upsert(
        kb,
        json.dumps({"id": "poison", "text": "t", "metadata": _nested(DEPTH + 1)}),
        "documents.0.metadata depth",
    )
    assert body["type"] == "/problems/limit-exceeded"
    assert f"{DEPTH + 1} exceeds the limit of {DEPTH}" in body["detail"]


@pytest.mark.parametrize("depth", [256, 300, 900])
def test_metadata_nested_past_the_serializer_is_refused(kb, depth):
    # Before the fix: 200, then GET and every search that returns it give 500.
    doc = json.dumps({"id": "poison", "text": "t", "metadata": _nested(depth)})
    _refused_upsert(kb, doc, "documents.0.metadata depth")


@pytest.mark.parametrize(
    "where",
    ["metadata", "filter", "body"],
)
def test_json_nested_10000_deep_is_4xx(kb, where):
    deep = "[" * 10_000 + "]" * 10_000
    if where == "metadata":
        r = _raw(
            kb,
            "PUT",
            DOCS,
            f'{{"documents": [{{"id": "poison", "text": "t", "metadata": {{"a": {deep}}}}}]}}',
        )
    elif where == "filter":
        r = _raw(kb, "POST", SEARCH, f'{{"query": "q", "filter": {{"a": {deep}}}}}')
    else:
        r = _raw(kb, "POST", SEARCH, deep)
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert _count(kb) == 1
    assert_problem(kb.get(f"{DOCS}/poison"), 404)
    _assert_healthy(kb)


def test_metadata_depth_limit_is_read_from_the_environment(
    tmp_path, embedder, monkeypatch
):
    monkeypatch.setenv("NORMCAL_MAX_METADATA_DEPTH", "3")
    settings = Settings(data_dir=tmp_path / "d")
    assert settings.limits.max_metadata_depth == 3
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        ok = {"id": "a", "text": "t", "metadata": {"a": [{"b": 1}]}}
        assert c.put(DOCS, json={"documents": [ok]}).status_code == 200
        poison = {"id": "poison", "text": "t", "metadata": {"a": [{"b": [1]}]}}
        assert_problem(c.put(DOCS, json={"documents": [poison]}), 422)
        assert _count(c) == 1
    # Past what responses can serialize, the setting itself is refused.
    monkeypatch.setenv("NORMCAL_MAX_METADATA_DEPTH", "129")
    with pytest.raises(ValueError, match="max_metadata_depth"):
        Settings(data_dir=tmp_path / "d")


# -- defect 2: numbers ----------------------------------------------------------------
@pytest.mark.parametrize(
    "value", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", '[1, {"x": NaN}]']
)
def test_non_finite_numbers_in_metadata_are_422(kb, value):
    # Before the fix: stored as null, then every filtered search on the collection gives 500.
    doc = f'{{"id": "poison", "text": "t", "metadata": {{"a": {value}}}}}'
    body = _refused_upsert(kb, doc, "documents.0.metadata")
    assert "finite" in body["detail"]


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_integers_outside_64_bits_in_metadata_are_422(kb, value):
    doc = json.dumps({"id": "poison", "text": "t", "metadata": {"a": {"b": [value]}}})
    body = _refused_upsert(kb, doc, "documents.0.metadata")
    assert "64-bit" in body["detail"] and "a.b.0" in body["detail"]


def test_what_was_stored_is_returned_unchanged(kb):
    metadata = {
        "max": INT64_MAX,
        "min": -(2**63),
        "tenth": 0.1,
        "tiny": 1e-300,
        "negative": -2.5e-10,
        "big_float": 1.7976931348623157e308,
        "int_like_float": 3.0,
        "text": 'naïve café 東京 🚀 e\u0301 "quoted" \\',
        "control": "a\u0001b\u001f\u007f",  # NUL is refused (test_bounds.py)
        "empty": {"list": [], "object": {}, "string": ""},
        "flags": [True, False, None],
        "emoji key 🔑": "ok",
        # metadata + _nested + the leaf list: exactly at the depth limit
        "deep": _nested(DEPTH - 2, leaf=[INT64_MAX, 0.1, "🚀"]),
    }
    doc = {"id": "round-trip", "text": "Everything comes back.", "metadata": metadata}
    assert kb.put(DOCS, json={"documents": [doc]}).status_code == 200
    stored = kb.get(f"{DOCS}/round-trip").json()["metadata"]
    assert stored == metadata
    assert json.dumps(stored, sort_keys=True) == json.dumps(metadata, sort_keys=True)
    for key in ("max", "min", "tenth", "tiny", "int_like_float", "text", "control"):
        r = kb.post(
            SEARCH, json={"query": "comes back", "filter": {key: metadata[key]}}
        )
        assert r.status_code == 200, r.text
        assert [h["id"] for h in r.json()["hits"]] == ["round-trip"], key


# -- defects 2 and 3: lone surrogates ---------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (
            '{"id": "poison", "text": "t", "metadata": {"\\ud800": 1}}',
            "documents.0.metadata",
        ),
        (
            '{"id": "poison", "text": "t", "metadata": {"a": "\\ud800"}}',
            "documents.0.metadata",
        ),
        (
            '{"id": "poison", "text": "t", "metadata": {"a": [{"b": ["x\\udfff"]}]}}',
            "documents.0.metadata",
        ),
        (
            '{"id": "poison", "text": "t", "metadata": {"a": {"\\udc00b": 1}}}',
            "documents.0.metadata",
        ),
        ('{"id": "poison\\ud800", "text": "t"}', "documents.0.id"),
        ('{"id": "poison", "text": "t\\ud800"}', "documents.0.text"),
    ],
)
def test_lone_surrogates_in_documents_are_422(kb, doc, field):
    # Before the fix: metadata keys and values give 500 (UnicodeEncodeError).
    _refused_upsert(kb, doc, field)


@pytest.mark.parametrize(
    "search",
    [
        '{"query": "q", "filter": {"\\ud800": 1}}',
        '{"query": "q", "filter": {"lang": "\\ud800"}}',
        '{"query": "q\\ud800"}',
    ],
)
def test_lone_surrogates_in_a_search_are_422(kb, search):
    assert_problem(_raw(kb, "POST", SEARCH, search), 422)
    _assert_healthy(kb)


@pytest.mark.parametrize(
    "judgment",
    [
        '{"query": "q\\ud800", "document_id": "seed", "relevance": 1}',
        '{"query": "q", "document_id": "seed\\ud800", "relevance": 1}',
    ],
)
@pytest.mark.parametrize("endpoint", ["feedback", "calibrators"])
def test_lone_surrogates_in_judgments_are_422(kb, judgment, endpoint):
    r = _raw(
        kb, "POST", f"/v1/collections/kb/{endpoint}", f'{{"judgments": [{judgment}]}}'
    )
    assert assert_problem(r, 422)["detail"].startswith("judgments.0.")
    _assert_nothing_judged(kb)


def _assert_nothing_judged(c: TestClient) -> None:
    """No feedback was stored and no calibrator was fitted."""
    listed = c.get("/v1/collections/kb/calibrators").json()["data"]
    assert [cal for cal in listed if not cal["default"]] == []
    one = {"query": "capital of France", "document_id": "seed", "relevance": 1}
    r = c.post("/v1/collections/kb/feedback", json={"judgments": [one]})
    assert r.status_code == 201 and r.json()["total"] == 1, r.text


# -- defect 3: hostile filter and judgment values ---------------------------------------
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (str(2**63), "64-bit"),
        (str(-(2**63) - 1), "64-bit"),
        ("NaN", "finite"),
        ("-Infinity", "finite"),
        ("1e400", "finite"),
    ],
)
def test_hostile_filter_values_are_422(kb, value, message):
    # Before the fix: OverflowError or "malformed JSON" from SQLite, a 500.
    r = _raw(kb, "POST", SEARCH, f'{{"query": "q", "filter": {{"lang": {value}}}}}')
    body = assert_problem(r, 422)
    assert body["detail"].startswith("filter: lang") and message in body["detail"]
    _assert_healthy(kb)


def test_filter_at_the_64_bit_bounds_is_served(kb):
    for value in (INT64_MAX, -(2**63)):
        r = kb.post(SEARCH, json={"query": "q", "filter": {"lang": value}})
        assert r.status_code == 200, r.text
        assert r.json()["hits"] == []


@pytest.mark.parametrize("relevance", [MAX_RELEVANCE + 1, 2**63, 2**64])
@pytest.mark.parametrize("endpoint", ["feedback", "calibrators"])
def test_relevance_past_its_bound_is_422(kb, relevance, endpoint):
    # Before the fix: feedback gives 500 (OverflowError binding it to SQLite).
    judgment = {"query": "q", "document_id": "seed", "relevance": relevance}
    r = kb.post(f"/v1/collections/kb/{endpoint}", json={"judgments": [judgment]})
    body = assert_problem(r, 422)
    assert body["detail"].startswith("judgments.0.relevance")
    _assert_nothing_judged(kb)


def test_relevance_at_its_bound_is_stored(kb):
    judgment = {"query": "q", "document_id": "seed", "relevance": MAX_RELEVANCE}
    r = kb.post("/v1/collections/kb/feedback", json={"judgments": [judgment]})
    assert r.status_code == 201, r.text
    assert r.json() == {"stored": 1, "total": 1}


# -- defect 9 (input half): NUL in ids, strict wire types ---------------------------------
def test_document_id_with_nul_is_422_in_the_body(kb):
    # Before the fix: 200; the id pattern let \S match the NUL itself.
    for doc_id in ("a\x00b", "\x00", "poison\x00"):
        doc = json.dumps({"id": doc_id, "text": "t"})
        _refused_upsert(kb, doc, "documents.0.id")


def test_document_id_with_nul_is_422_in_the_path(kb):
    assert (
        kb.put(DOCS, json={"documents": [{"id": "ab", "text": "t"}]}).status_code == 200
    )
    for path in (f"{DOCS}/a%00b", f"{DOCS}/%00", f"{DOCS}/ab%00"):
        assert_problem(kb.get(path), 422)
        assert_problem(kb.delete(path), 422)
    assert kb.get(f"{DOCS}/ab").status_code == 200
    assert _count(kb) == 2


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (SEARCH, {"query": "q", "k": True}, "k"),
        (SEARCH, {"query": "q", "k": "5"}, "k"),
        (SEARCH, {"query": "q", "k": 5.0}, "k"),
        (SEARCH, {"query": "q", "include_text": "true"}, "include_text"),
        (SEARCH, {"query": "q", "include_text": 1}, "include_text"),
        (SEARCH, {"query": "q", "min_probability": "0.5"}, "min_probability"),
        (SEARCH, {"query": "q", "min_probability": False}, "min_probability"),
        (
            "/v1/collections/kb/feedback",
            {"judgments": [{"query": "q", "document_id": "seed", "relevance": True}]},
            "judgments.0.relevance",
        ),
        (
            "/v1/collections/kb/feedback",
            {"judgments": [{"query": "q", "document_id": "seed", "relevance": "1"}]},
            "judgments.0.relevance",
        ),
        (
            "/v1/collections/kb/calibrators",
            {"judgments": [], "k": "20"},
            "k",
        ),
        ("/v1/collections/kb/calibrators", {"activate": "false"}, "activate"),
        ("/v1/collections/kb/calibrators", {"abstain_delta": "0.1"}, "abstain_delta"),
    ],
)
def test_wire_types_are_strict(kb, path, body, field):
    # Before the fix: true is taken as 1, "5" as 5, "false" as False.
    r = assert_problem(kb.post(path, json=body), 422)
    assert r["detail"].startswith(f"{field}:"), r
    assert kb.get("/v1/collections").json()["count"] == 1
    _assert_nothing_judged(kb)


def test_strict_types_still_take_legitimate_json(model_kb):
    """The real model: ``min_probability`` needs its default profile."""
    kb = model_kb
    # An int where a float is expected, a Literal, lists, nested models.
    r = kb.post(
        SEARCH,
        json={"queries": ["capital of France"], "k": 3, "min_probability": 0},
    )
    assert r.status_code == 200, r.text
    r = kb.post("/v1/embed", json={"texts": ["a", "b"], "input_type": "query"})
    assert r.status_code == 200, r.text
    docs = [
        {"id": "rome", "text": "Rome is the capital of Italy.", "metadata": {"n": 1}},
        {"id": "berlin", "text": "Berlin is the capital of Germany."},
    ]
    assert kb.put(DOCS, json={"documents": docs}).status_code == 200
    judgments = [
        {"query": "capital of France", "document_id": "seed", "relevance": 2},
        {"query": "capital of Italy", "document_id": "rome", "relevance": 1},
        {"query": "capital of Germany", "document_id": "berlin", "relevance": 0},
    ]
    r = kb.post("/v1/collections/kb/feedback", json={"judgments": judgments})
    assert r.status_code == 201, r.text
    # The Python client's own models send what the strict server accepts.
    client = NormcalClient("http://testserver", http_client=kb)
    sent = client.feedback("kb", [Judgment(query="q", document_id="rome", relevance=1)])
    assert sent.total == 4
    r = kb.post(
        "/v1/collections/kb/calibrators",
        json={"method": "platt", "k": 3, "abstain_target": None, "activate": False},
    )
    # Too few judgments to fit is a domain answer, not a type error.
    assert r.status_code in (201, 422), r.text
    if r.status_code == 422:
        assert r.json()["type"] != "/problems/validation-error", r.text
