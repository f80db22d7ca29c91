"""Bad input: a clear problem+json 4xx, and nothing written."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.conftest import assert_problem

# What the model makes of a text does not matter here: the deterministic fake.
pytestmark = pytest.mark.fake_embedder

LIMITS = Limits(
    max_texts_per_request=3,
    max_text_chars=40,
    max_documents_per_upsert=3,
    max_queries_per_search=2,
    max_k=5,
    max_metadata_bytes=64,
    max_id_chars=8,
)


@pytest.fixture
def small(tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "d", limits=LIMITS)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        yield c


def _count(c):
    info = c.get("/v1/collections/kb").json()
    assert info["documents"] == info["indexed"]
    return info["documents"]


def _docs(n, text="some text", **extra):
    return [{"id": f"d{i}", "text": text, **extra} for i in range(n)]


# -- limits: accepted at the bound, 422 one past it, nothing written ---------------------
def test_texts_per_embed_request(small):
    assert small.post("/v1/embed", json={"texts": ["a"] * 3}).status_code == 200
    body = assert_problem(small.post("/v1/embed", json={"texts": ["a"] * 4}), 422)
    assert "texts" in body["detail"] and "3" in body["detail"]


def test_chars_per_text(small):
    assert small.post("/v1/embed", json={"texts": ["x" * 40]}).status_code == 200
    assert_problem(small.post("/v1/embed", json={"texts": ["x" * 41]}), 422)
    put = small.put(
        "/v1/collections/kb/documents", json={"documents": _docs(1, "y" * 41)}
    )
    assert_problem(put, 422)
    q = small.post("/v1/collections/kb/search", json={"query": "q" * 41})
    assert_problem(q, 422)
    assert _count(small) == 0


def test_documents_per_upsert(small):
    body = assert_problem(
        small.put("/v1/collections/kb/documents", json={"documents": _docs(4)}), 422
    )
    assert body["errors"][0]["loc"] == ["documents"]
    assert _count(small) == 0
    assert (
        small.put(
            "/v1/collections/kb/documents", json={"documents": _docs(3)}
        ).status_code
        == 200
    )
    assert _count(small) == 3


def test_k_bounds(small):
    small.put("/v1/collections/kb/documents", json={"documents": _docs(3)})
    ok = small.post("/v1/collections/kb/search", json={"query": "text", "k": 5})
    assert ok.status_code == 200 and len(ok.json()["hits"]) == 3
    assert_problem(
        small.post("/v1/collections/kb/search", json={"query": "text", "k": 6}), 422
    )
    assert_problem(
        small.post("/v1/collections/kb/search", json={"query": "text", "k": 0}), 422
    )


def test_queries_per_search(small):
    ok = small.post("/v1/collections/kb/search", json={"queries": ["a", "b"]})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2
    assert_problem(
        small.post("/v1/collections/kb/search", json={"queries": ["a", "b", "c"]}), 422
    )


def test_metadata_size_and_id_length(small):
    meta_ok = {"k": "v" * 55}  # {"k": "vvv…"} is exactly 64 bytes
    assert len(json.dumps(meta_ok)) == 64
    r = small.put(
        "/v1/collections/kb/documents",
        json={"documents": [{"id": "a", "text": "t", "metadata": meta_ok}]},
    )
    assert r.status_code == 200
    too_big = {"k": "v" * 56}
    r = small.put(
        "/v1/collections/kb/documents",
        json={"documents": [{"id": "b", "text": "t", "metadata": too_big}]},
    )
    assert_problem(r, 422)
    ok_id = small.put(
        "/v1/collections/kb/documents",
        json={"documents": [{"id": "x" * 8, "text": "t"}]},
    )
    assert ok_id.status_code == 200
    assert_problem(
        small.put(
            "/v1/collections/kb/documents",
            json={"documents": [{"id": "x" * 9, "text": "t"}]},
        ),
        422,
    )
    assert _count(small) == 2


# -- malformed and ill-typed requests ---------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embed", {"texts": []}),
        ("/v1/embed", {"texts": [""]}),
        ("/v1/embed", {"texts": ["   "]}),
        ("/v1/embed", {"texts": "not a list"}),
        ("/v1/embed", {"texts": [1, 2]}),
        ("/v1/embed", {"texts": ["a"], "input_type": "passage"}),
        ("/v1/embed", {"texts": ["a"], "unknown": 1}),
        ("/v1/collections/kb/search", {}),
        ("/v1/collections/kb/search", {"query": "a", "queries": ["b"]}),
        ("/v1/collections/kb/search", {"query": "a", "k": "ten"}),
        ("/v1/collections/kb/search", {"query": "a", "filter": {"x": [1]}}),
        ("/v1/collections/kb/search", {"query": "a", "min_probability": 1.5}),
        ("/v1/collections", {"name": "../etc"}),
        ("/v1/collections", {"name": ""}),
        ("/v1/collections", {"name": "a" * 65}),
        ("/v1/collections", {"name": "nul\x00byte"}),
    ],
)
def test_invalid_bodies_are_422(small, path, body):
    assert_problem(small.post(path, json=body), 422)
    assert small.get("/v1/collections").json()["count"] == 1


def test_invalid_documents_write_nothing(small):
    bad = [
        {"documents": []},
        {"documents": [{"id": "a", "text": ""}]},
        {"documents": [{"id": "", "text": "t"}]},
        {"documents": [{"id": "a", "text": "t", "metadata": "str"}]},
        {"documents": [{"id": "a", "text": "t"}, {"id": "a", "text": "u"}]},
        {"documents": [{"id": "a", "text": "t"}, {"id": "b"}]},
    ]
    for body in bad:
        assert_problem(small.put("/v1/collections/kb/documents", json=body), 422)
    assert _count(small) == 0


def test_malformed_json_is_400(small):
    r = small.post(
        "/v1/embed",
        content=b'{"texts": ["a"',
        headers={"content-type": "application/json"},
    )
    assert assert_problem(r, 400)["title"] == "Malformed JSON body"


# -- missing and conflicting resources ---------------------------------------------------------
def test_unknown_collection_and_document_are_404(small):
    assert_problem(small.get("/v1/collections/nope"), 404)
    assert_problem(small.delete("/v1/collections/nope"), 404)
    assert_problem(small.post("/v1/collections/nope/search", json={"query": "a"}), 404)
    assert_problem(
        small.put("/v1/collections/nope/documents", json={"documents": _docs(1)}), 404
    )
    body = assert_problem(small.get("/v1/collections/kb/documents/nope"), 404)
    assert "nope" in body["detail"]
    assert_problem(small.get("/v1/nothing-here"), 404)


def test_bad_collection_name_in_path_is_422(small):
    assert_problem(small.get("/v1/collections/a%00b"), 422)
    assert_problem(small.get("/v1/collections/" + "a" * 65), 422)
    assert_problem(small.get("/v1/collections/a..b"), 422)
    # An encoded slash never reaches a handler: no route has a slash in the name.
    assert_problem(small.get("/v1/collections/..%2Fetc"), 404)


def test_duplicate_collection_is_409(small):
    assert_problem(small.post("/v1/collections", json={"name": "kb"}), 409)
    assert small.get("/v1/collections").json()["count"] == 1


def test_request_id_is_echoed(small):
    r = small.get("/v1/collections/nope", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert r.json()["instance"] == "urn:request:abc-123"


def test_internal_errors_do_not_leak(small, monkeypatch):
    from app.collections.registry import CollectionRegistry

    def boom(self, name):
        raise RuntimeError("secret internals /etc/passwd")

    monkeypatch.setattr(CollectionRegistry, "get", boom)
    small_raise = TestClient(small.app, raise_server_exceptions=False)
    r = small_raise.get("/v1/collections/kb")
    body = assert_problem(r, 500)
    assert "secret" not in r.text and "passwd" not in body["detail"]
