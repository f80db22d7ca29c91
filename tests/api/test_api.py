"""The HTTP API end to end: real model, real FAISS, real SQLite, real ASGI stack."""

from __future__ import annotations

import pytest

from tests.support.corpus import CORPUS, QUERIES


def _docs(**metadata):
    return [
        {"id": key, "text": text, "metadata": {"topic": key, **metadata}}
        for key, text in CORPUS.items()
    ]


@pytest.fixture
def filled(client):
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    r = client.put("/v1/collections/kb/documents", json={"documents": _docs()})
    assert r.status_code == 200, r.text
    return client


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["dim"] == 384


def test_an_app_given_a_shared_model_leaves_the_garbage_collector_alone(app):
    """Only a process that loaded its model (``normcal serve``) freezes its start-up
    heap (``lifespan.freeze_start_up``): tests sharing one model must not, or every
    test's objects would outlive it."""
    import gc

    from fastapi.testclient import TestClient

    frozen = gc.get_freeze_count()
    with TestClient(app) as client:  # runs the lifespan
        assert client.get("/healthz").status_code == 200
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle made while serving
    # Not ==: a frozen object freed meanwhile leaves the count (run alone, this test
    # saw 3 fewer); a freeze would add every live object.
    assert gc.get_freeze_count() <= frozen


def test_a_server_renders_its_openapi_document_before_the_first_request(
    embedder, tmp_path, monkeypatch
):
    """The access log maps paths to route templates read from the OpenAPI document;
    ``normcal serve`` (the lifespan loads the model) renders it during start-up, so
    its first request does not wait ~0.2 s for it."""
    from fastapi.testclient import TestClient

    import app.api.lifespan
    from app.api.app import create_app
    from app.settings import Settings

    frozen: list[bool] = []
    monkeypatch.setattr(app.api.lifespan, "load_embedder", lambda _s: embedder)
    monkeypatch.setattr(
        app.api.lifespan, "freeze_start_up", lambda: frozen.append(True)
    )
    server = create_app(Settings(data_dir=tmp_path))  # no shared model: the server's
    assert server.openapi_schema is None
    with TestClient(server):  # start-up only: no request is sent
        assert server.openapi_schema is not None and frozen == [True]


def test_embed_returns_unit_vectors_and_norms(client):
    r = client.post(
        "/v1/embed", json={"texts": ["hello", "world peace"], "input_type": "query"}
    )
    assert r.status_code == 200
    body = r.json()
    assert body["dim"] == 384 and len(body["data"]) == 2
    for item in body["data"]:
        assert sum(x * x for x in item["embedding"]) == pytest.approx(1.0, abs=1e-4)
        assert item["norm"] > 1.5 and item["n_tokens"] >= 3


def test_each_query_finds_its_document_first(filled):
    for key, query in QUERIES.items():
        r = filled.post("/v1/collections/kb/search", json={"query": query, "k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["hits"][0]["id"] == key
        scores = [h["score"] for h in body["hits"]]
        assert scores == sorted(scores, reverse=True) and -1 <= scores[-1] <= 1
        assert body["query"]["norm"] > 0 and body["query"]["n_tokens"] > 0
        assert body["hits"][0]["metadata"] == {"topic": key}
        assert body["hits"][0]["text"] is None


def test_stored_norm_equals_embed_norm(filled):
    doc = filled.get("/v1/collections/kb/documents/paris").json()
    embedded = filled.post("/v1/embed", json={"texts": [CORPUS["paris"]]}).json()
    assert doc["norm"] == pytest.approx(embedded["data"][0]["norm"], rel=1e-6)
    assert doc["text"] == CORPUS["paris"]


def test_batch_queries_filter_and_include_text(filled):
    r = filled.post(
        "/v1/collections/kb/search",
        json={"queries": list(QUERIES.values()), "k": 5, "include_text": True},
    )
    results = r.json()["results"]
    assert [res["hits"][0]["id"] for res in results] == list(QUERIES)
    assert results[0]["hits"][0]["text"] == CORPUS["aspirin"]
    r = filled.post(
        "/v1/collections/kb/search",
        json={"query": QUERIES["aspirin"], "k": 5, "filter": {"topic": "paris"}},
    )
    assert [h["id"] for h in r.json()["hits"]] == ["paris"]
    r = filled.post(
        "/v1/collections/kb/search",
        json={"query": QUERIES["aspirin"], "k": 5, "filter": {"topic": "nowhere"}},
    )
    assert r.json()["hits"] == []


def test_filter_types_do_not_coerce(client):
    client.post("/v1/collections", json={"name": "typed"})
    docs = [
        {"id": "s", "text": "one", "metadata": {"v": "1"}},
        {"id": "i", "text": "one", "metadata": {"v": 1}},
        {"id": "b", "text": "one", "metadata": {"v": True}},
    ]
    client.put("/v1/collections/typed/documents", json={"documents": docs})
    for value, expected in (("1", "s"), (1, "i"), (True, "b")):
        r = client.post(
            "/v1/collections/typed/search",
            json={"query": "one", "filter": {"v": value}},
        )
        assert [h["id"] for h in r.json()["hits"]] == [expected]


def test_upsert_is_idempotent_and_replaces(filled):
    before = filled.get("/v1/collections/kb").json()
    again = filled.put("/v1/collections/kb/documents", json={"documents": _docs()})
    assert again.status_code == 200
    after = filled.get("/v1/collections/kb").json()
    assert after["documents"] == after["indexed"] == before["documents"] == 5

    new_text = "The Eiffel Tower stands in Paris."
    old = filled.get("/v1/collections/kb/documents/paris").json()
    filled.put(
        "/v1/collections/kb/documents",
        json={"documents": [{"id": "paris", "text": new_text, "metadata": {"v": 2}}]},
    )
    doc = filled.get("/v1/collections/kb/documents/paris").json()
    assert doc["text"] == new_text and doc["metadata"] == {"v": 2}
    assert doc["norm"] != pytest.approx(old["norm"])
    r = filled.post("/v1/collections/kb/search", json={"query": "Eiffel Tower", "k": 5})
    hits = r.json()["hits"]
    assert hits[0]["id"] == "paris" and len(hits) == 5  # replaced, not duplicated


def test_delete_document_and_collection(filled):
    assert filled.delete("/v1/collections/kb/documents/paris").status_code == 204
    assert filled.get("/v1/collections/kb/documents/paris").status_code == 404
    assert filled.delete("/v1/collections/kb/documents/paris").status_code == 404
    r = filled.post(
        "/v1/collections/kb/search", json={"query": QUERIES["paris"], "k": 10}
    )
    assert "paris" not in [h["id"] for h in r.json()["hits"]]
    info = filled.get("/v1/collections/kb").json()
    assert info["documents"] == info["indexed"] == 4
    assert filled.delete("/v1/collections/kb").status_code == 204
    assert filled.get("/v1/collections/kb").status_code == 404
    assert filled.get("/v1/collections").json() == {"data": [], "count": 0}


def test_collections_survive_restart(settings, embedder, filled):
    from fastapi.testclient import TestClient

    from app.api.app import create_app

    filled.close()  # runs the lifespan shutdown: SQLite closed
    with TestClient(create_app(settings, embedder=embedder)) as again:
        info = again.get("/v1/collections/kb").json()
        assert info["documents"] == info["indexed"] == 5
        r = again.post("/v1/collections/kb/search", json={"query": QUERIES["faiss"]})
        assert r.json()["hits"][0]["id"] == "faiss"


def test_hnsw_index_serves_the_same_neighbours(tmp_path, embedder):
    from fastapi.testclient import TestClient

    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path / "h", index_type="hnsw")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.post("/v1/collections", json={"name": "kb"})
        c.put("/v1/collections/kb/documents", json={"documents": _docs()})
        c.put(
            "/v1/collections/kb/documents",
            json={"documents": [{"id": "paris", "text": "Berlin is in Germany."}]},
        )
        info = c.get("/v1/collections/kb").json()
        assert info["index_type"] == "hnsw" and info["indexed"] == 5
        for key, query in QUERIES.items():
            if key == "paris":
                continue
            r = c.post("/v1/collections/kb/search", json={"query": query, "k": 5})
            hits = [h["id"] for h in r.json()["hits"]]
            assert hits[0] == key and len(hits) == len(set(hits)) == 5
