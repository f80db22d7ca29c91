"""Metadata updates without re-embedding: ``PATCH .../documents/{id}`` and
``POST .../documents/update``, on both storage backends.

Real model, real engines, real HTTP (the storage contract's backends: the Milvus
cases are slow). What must not move is checked where a user would see it: the
document's score and BM25 for a query, its norm and token count, its place in the
listing; what must move, by a filter right after the response.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Limits
from tests.collections.test_storage_contract import (
    BACKENDS,
    DOCS,
    URL,
    engine_settings,
    everything,
)
from tests.conftest import assert_problem
from tests.support.corpus import QUERIES

MAX_UPDATES = 3  # limits.max_documents_per_upsert, which bounds a batch update too
MAX_METADATA_BYTES = 64
LIMITS = Limits(
    max_k=8,
    max_documents_per_upsert=MAX_UPDATES,
    max_metadata_bytes=MAX_METADATA_BYTES,
)


@pytest.fixture(params=BACKENDS)
def kb(
    request: pytest.FixtureRequest, tmp_path: Path, embedder: Any
) -> Iterator[TestClient]:
    """A client with collection ``kb`` holding the five documents of the contract."""
    settings = engine_settings(str(request.param), tmp_path, request)
    settings = settings.model_copy(update={"limits": LIMITS})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        for start in range(0, len(DOCS), MAX_UPDATES):
            batch = DOCS[start : start + MAX_UPDATES]
            r = client.put(f"{URL}/documents", json={"documents": batch})
            assert r.status_code == 200, r.text
        yield client


def hit(client: TestClient, doc_id: str, **search: Any) -> dict[str, Any] | None:
    """``doc_id``'s hit for its own query (dense, k = 5), or None."""
    body = {"query": QUERIES[doc_id], "k": 5, **search}
    r = client.post(f"{URL}/search", json=body)
    assert r.status_code == 200, r.text
    return next((h for h in r.json()["hits"] if h["id"] == doc_id), None)


def listing(client: TestClient) -> list[str]:
    r = client.get(f"{URL}/documents", params={"limit": 8})
    assert r.status_code == 200, r.text
    return [d["id"] for d in r.json()["data"]]


def metadata(client: TestClient, doc_id: str) -> dict[str, Any]:
    r = client.get(f"{URL}/documents/{doc_id}")
    assert r.status_code == 200, r.text
    return dict(r.json()["metadata"])


def test_patch_merges_and_leaves_vector_norm_bm25_and_place_alone(kb: TestClient):
    before, order = hit(kb, "aspirin"), listing(kb)
    assert before is not None and metadata(kb, "aspirin") == {"topic": "health", "n": 0}
    r = kb.patch(f"{URL}/documents/aspirin", json={"metadata": {"n": None, "x": "y"}})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"topic": "health", "x": "y"}  # n removed by null
    assert metadata(kb, "aspirin") == {"topic": "health", "x": "y"}
    after = hit(kb, "aspirin")
    assert after is not None
    for key in ("score", "bm25", "norm", "n_tokens"):
        assert after[key] == before[key], key
    assert after["metadata"] == {"topic": "health", "x": "y"}
    assert listing(kb) == order  # an update is not a new write position


def test_replace_sets_the_whole_object_and_a_filter_sees_it_at_once(kb: TestClient):
    assert hit(kb, "paris", filter={"topic": "travel"}) is None
    r = kb.patch(
        f"{URL}/documents/paris",
        json={"metadata": {"topic": "travel", "kept": None}, "mode": "replace"},
    )
    assert r.status_code == 200, r.text
    assert metadata(kb, "paris") == {"topic": "travel", "kept": None}  # stored as sent
    assert hit(kb, "paris", filter={"topic": "travel"}) is not None
    assert hit(kb, "paris", filter={"topic": "places"}) is None


def test_a_batch_updates_every_listed_document_in_request_order(kb: TestClient):
    updates = [
        {"id": "python", "metadata": {"topic": "code"}},
        {"id": "faiss", "metadata": {"topic": "code"}},
        {"id": "aspirin", "metadata": {"n": 9}},
    ]  # exactly MAX_UPDATES: the bound
    r = kb.post(f"{URL}/documents/update", json={"updates": updates})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["updated"] == 3
    assert [d["id"] for d in body["data"]] == ["python", "faiss", "aspirin"]
    assert body["data"][2]["metadata"] == {"topic": "health", "n": 9}
    found = kb.post(
        f"{URL}/search", json={"query": "software", "k": 5, "filter": {"topic": "code"}}
    )
    assert found.status_code == 200, found.text
    assert {h["id"] for h in found.json()["hits"]} == {"python", "faiss"}


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        # an unknown document: nothing else in the batch changes either
        (
            "update",
            {
                "updates": [
                    {"id": "python", "metadata": {"topic": "x"}},
                    {"id": "nope", "metadata": {}},
                ]
            },
            404,
            None,
        ),
        ("nope", {"metadata": {"topic": "x"}}, 404, None),
        ("aspirin", {"metadata": {"topic": "x"}, "text": "new text"}, 422, None),
        ("aspirin", {"metadata": {"topic": "x"}, "vector": [1.0]}, 422, None),
        ("aspirin", {"metadata": ["not", "an", "object"]}, 422, None),
        ("aspirin", {"metadata": {"topic": "x"}, "mode": "append"}, 422, None),
        ("aspirin", {}, 422, None),
        # past the size bound as sent, and only once merged with what is stored
        ("aspirin", {"metadata": {"big": "x" * MAX_METADATA_BYTES}}, 422, "metadata"),
        ("aspirin", {"metadata": {"big": "x" * 30}}, 422, "metadata"),
        (
            "update",
            {
                "updates": [
                    {"id": "python", "metadata": {"a": 1}},
                    {"id": "python", "metadata": {"b": 2}},
                ]
            },
            422,
            "updates",
        ),
        (
            "update",
            {"updates": [{"id": d["id"], "metadata": {}} for d in DOCS[:4]]},
            422,
            "updates",
        ),  # one past MAX_UPDATES
        ("update", {"updates": []}, 422, None),
    ],
)
def test_bad_updates_change_nothing(kb, path, body, status, field):
    before = everything(kb)
    if path == "update":
        r = kb.post(f"{URL}/documents/update", json=body)
    else:
        r = kb.patch(f"{URL}/documents/{path}", json=body)
    problem = assert_problem(r, status)
    if field is not None:
        assert problem.get("field", field) == field, problem
    assert everything(kb) == before


def test_the_size_bound_holds_at_the_bound_after_a_merge(kb: TestClient):
    stored = '{"topic": "health", "n": 0, "big": ""}'  # the JSON the check measures
    room = MAX_METADATA_BYTES - len(stored)
    at = {"big": "x" * room}
    assert (
        kb.patch(f"{URL}/documents/aspirin", json={"metadata": at}).status_code == 200
    )
    past = {"big": "x" * (room + 1)}
    assert_problem(kb.patch(f"{URL}/documents/aspirin", json={"metadata": past}))
    assert metadata(kb, "aspirin")["big"] == "x" * room
