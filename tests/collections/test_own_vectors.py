"""Bring your own vectors: a collection created with ``embedding`` takes ``vector``.

Real model, real engines, real HTTP, on both storage backends (``BACKENDS`` of the
storage contract: the Milvus cases are slow). The "own" vectors are the real model's,
sent raw (unit vector times norm) under another model's name, so hits and fits mean
something; the server never embeds them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.api.app import create_app
from app.schemas.search import SearchRequest
from app.services.own_vectors import NO_QUERY_TEXT
from app.settings import Limits, Settings
from tests.collections.test_storage_contract import (
    BACKENDS,
    JUDGMENTS,
    TOPIC,
    engine_settings,
)
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES

DIM = 384  # the real model's, sent as the client's own: limits.max_dimension here
OWN = {"dimension": DIM, "model": "offline-minilm"}
URL = "/v1/collections/own"
LIMITS = Limits(max_k=8, max_dimension=DIM)


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settings(tmp_path: Path, storage: str, request: pytest.FixtureRequest) -> Settings:
    return engine_settings(storage, tmp_path, request).model_copy(
        update={"limits": LIMITS}
    )


@pytest.fixture
def client(settings: Settings, embedder: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings, embedder=embedder)) as c:
        yield c


def raw_vectors(client: TestClient, texts: list[str], side: str) -> list[list[float]]:
    """The real model's raw vectors (unit vector times norm), as a client sends its own."""
    r = client.post("/v1/embed", json={"texts": texts, "input_type": side})
    assert r.status_code == 200, r.text
    return [[x * e["norm"] for x in e["embedding"]] for e in r.json()["data"]]


@pytest.fixture
def own(client: TestClient) -> TestClient:
    """``client`` with collection ``own`` (the client's vectors) holding the corpus."""
    return fill(client)


def fill(client: TestClient) -> TestClient:
    """Create collection ``own`` of the client's vectors and upsert the corpus."""
    r = client.post("/v1/collections", json={"name": "own", "embedding": OWN})
    assert r.status_code == 201, r.text
    vectors = raw_vectors(client, list(CORPUS.values()), "document")
    docs = [
        {"id": k, "text": t, "metadata": {"topic": TOPIC[k]}, "vector": v}
        for (k, t), v in zip(CORPUS.items(), vectors, strict=True)
    ]
    r = client.put(f"{URL}/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    return client


def field_of(problem: dict[str, Any]) -> str:
    """The field a 422 names (``documents.0.vector``)."""
    return ".".join(str(part) for part in problem["errors"][0]["loc"])


def query_vectors(client: TestClient) -> dict[str, list[float]]:
    texts = list(QUERIES.values())
    return dict(zip(texts, raw_vectors(client, texts, "query"), strict=True))


def state(client: TestClient) -> Any:
    """What a refused request must leave unchanged: collections, documents, calibrators."""
    names = sorted(c["name"] for c in client.get("/v1/collections").json()["data"])
    out: dict[str, Any] = {"names": names}
    for name in names:
        docs = client.get(f"/v1/collections/{name}/documents").json()["data"]
        out[name] = sorted((d["id"], d["text"], d["norm"], d["n_tokens"]) for d in docs)
        out[f"{name}.calibrators"] = [
            c["id"]
            for c in client.get(f"/v1/collections/{name}/calibrators").json()["data"]
        ]
    return out


# -- create, upsert, search -----------------------------------------------------------
def test_a_collection_of_own_vectors_is_described_with_the_agnostic_default(
    client: TestClient,
):
    r = client.post("/v1/collections", json={"name": "own", "embedding": OWN})
    assert r.status_code == 201, r.text
    info = client.get(URL).json()
    assert (info["embedding"], info["model"], info["dim"]) == (
        "client",
        "offline-minilm",
        DIM,
    )
    assert info["model_id"] is None
    ref = info["calibrator"]
    assert (ref["status"], ref["id"]) == ("default", "default-model-agnostic")
    assert "client's own" in ref["reason"] and "offline-minilm" in ref["reason"]
    assert ref["next_step"] is None  # the judging page cannot embed its queries
    assert client.post("/v1/collections", json={"name": "kb"}).json()["embedding"] == (
        "server"
    )


def test_documents_keep_the_raw_length_as_norm(own: TestClient):
    raw = raw_vectors(own, [CORPUS["paris"]], "document")[0]
    doc = own.get(f"{URL}/documents/paris").json()
    assert doc["norm"] == pytest.approx(math.hypot(*raw), rel=1e-6)
    assert doc["n_tokens"] > 1 and doc["truncated"] is False
    # A unit vector is fine too: its norm is 1.
    unit = [x / doc["norm"] for x in raw]
    r = own.put(
        f"{URL}/documents",
        json={"documents": [{"id": "unit", "text": CORPUS["paris"], "vector": unit}]},
    )
    assert r.status_code == 200, r.text
    assert own.get(f"{URL}/documents/unit").json()["norm"] == pytest.approx(1.0)


def test_search_by_vector_with_text_is_calibrated_in_every_mode(own: TestClient):
    vectors = query_vectors(own)
    for doc, text in QUERIES.items():
        for mode in ("dense", "hybrid"):
            r = own.post(
                f"{URL}/search",
                json={"vector": vectors[text], "query": text, "mode": mode, "k": 3},
            )
            assert r.status_code == 200, r.text
            result = r.json()
            assert result["hits"][0]["id"] == doc, (mode, text)
            assert result["hits"][0]["probability"] is not None
            assert result["confidence"] is not None
            assert result["calibrator"]["id"] == "default-model-agnostic"
            assert result["query"]["n_tokens"] > 1
    r = own.post(
        f"{URL}/search",
        json={"vectors": list(vectors.values()), "queries": list(vectors), "k": 1},
    )
    assert r.status_code == 200, r.text
    assert [res["hits"][0]["id"] for res in r.json()["results"]] == list(QUERIES)


def test_search_by_vector_alone_is_uncalibrated_and_says_why(own: TestClient):
    vector = query_vectors(own)[QUERIES["faiss"]]
    r = own.post(f"{URL}/search", json={"vector": vector, "k": 2})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["hits"][0]["id"] == "faiss"
    assert result["hits"][0]["probability"] is None and result["confidence"] is None
    assert result["calibrator"]["status"] == "none"
    assert result["calibrator"]["reason"] == NO_QUERY_TEXT
    assert result["query"]["n_tokens"] == 0
    filtered = own.post(
        f"{URL}/search", json={"vector": vector, "filter": {"topic": "places"}}
    )
    assert [h["id"] for h in filtered.json()["hits"]] == ["paris"]
    for body, field in [
        ({"vector": vector, "mode": "lexical"}, "mode"),
        ({"vector": vector, "mode": "hybrid"}, "mode"),
        ({"vector": vector, "min_probability": 0.5}, "min_probability"),
    ]:
        problem = assert_problem(own.post(f"{URL}/search", json=body))
        assert field_of(problem) == field, problem


# -- refused input ----------------------------------------------------------------------
def test_bad_vectors_are_422_and_change_nothing(own: TestClient):
    assert own.post("/v1/collections", json={"name": "kb"}).status_code == 201
    good = raw_vectors(own, ["x"], "document")[0]
    before = state(own)
    put = f"{URL}/documents"
    doc = {"id": "new", "text": "new text"}
    cases: list[tuple[str, str, Any, str]] = [
        ("PUT", put, {"documents": [{**doc, "vector": good[:-1]}]}, "documents.0.vector"),
        ("PUT", put, {"documents": [{**doc, "vector": [0.0] * DIM}]}, "documents.0.vector"),
        ("PUT", put, {"documents": [{**doc, "vector": [1e300] * DIM}]}, "documents.0.vector"),
        ("PUT", put, {"documents": [{**doc, "vector": good}, {**doc, "id": "2"}]}, "documents.1.vector"),
        ("PUT", "/v1/collections/kb/documents", {"documents": [{**doc, "vector": good}]},
         "documents.0.vector"),
        ("POST", f"{URL}/search", {"vector": [*good, 1.0]}, "vector"),
        ("POST", f"{URL}/search", {"vectors": [good, [0.0] * DIM]}, "vectors.1"),
        ("POST", f"{URL}/search", {"query": "text alone"}, "vector"),
        ("POST", "/v1/collections/kb/search", {"vector": good}, "vector"),
        ("POST", "/v1/collections", {"name": "big", "embedding": {**OWN, "dimension": DIM + 1}},
         "embedding.dimension"),
    ]  # fmt: skip
    for method, url, body, field in cases:
        problem = assert_problem(own.request(method, url, json=body))
        assert field_of(problem) == field, (body, problem)
    for value in ("NaN", "Infinity", "-Infinity"):  # Python's JSON reads these
        vector = json.dumps(good[:-1])[:-1] + f", {value}]"
        body = f'{{"documents": [{{"id": "new", "text": "t", "vector": {vector}}}]}}'
        r = own.put(put, content=body, headers={"content-type": "application/json"})
        assert_problem(r)
    assert state(own) == before


def test_search_request_takes_texts_beside_vectors_only():
    v = [1.0, 0.0]
    for body in (
        {"vector": v, "query": "q"},
        {"vectors": [v, v], "queries": ["a", "b"]},
        {"vectors": [v]},
    ):
        assert SearchRequest.model_validate(body).own_vectors is not None
    for body in (
        {"vector": v, "vectors": [v]},
        {"vector": v, "queries": ["q"]},
        {"vectors": [v], "query": "q"},
        {"vectors": [v, v], "queries": ["a"]},
        {"vector": []},
    ):
        with pytest.raises(ValidationError):
            SearchRequest.model_validate(body)


# -- calibration ------------------------------------------------------------------------
def test_a_fit_takes_the_judged_queries_own_vectors(own: TestClient):
    vectors = query_vectors(own)
    feedback = own.post(f"{URL}/feedback", json={"judgments": JUDGMENTS[:5]})
    assert feedback.status_code == 201, feedback.text
    before = state(own)
    lacking = dict(list(vectors.items())[1:])
    for body, field in [
        ({"judgments": JUDGMENTS[5:]}, "query_vectors"),
        ({"judgments": JUDGMENTS[5:], "query_vectors": lacking}, "query_vectors"),
    ]:
        problem = assert_problem(own.post(f"{URL}/calibrators", json=body))
        assert field_of(problem) == field, problem
    assert state(own) == before
    listed = own.get(f"{URL}/calibrators").json()["data"]
    serving = [("default-model-agnostic", True, True)]  # (id, default, active)
    assert [(c["id"], c["default"], c["active"]) for c in listed] == serving
    r = own.post(
        f"{URL}/calibrators",
        json={"judgments": JUDGMENTS[5:], "query_vectors": vectors, "method": "platt"},
    )
    assert r.status_code == 201, r.text
    fitted = r.json()
    listed = own.get(f"{URL}/calibrators").json()["data"]
    assert [c["active"] for c in listed] == [False, True]
    assert fitted["active"] and fitted["report"]["n_queries"] == len(QUERIES)
    text = QUERIES["paris"]
    result = own.post(f"{URL}/search", json={"vector": vectors[text], "query": text})
    ref = result.json()["calibrator"]
    assert (ref["status"], ref["id"], ref["reason"]) == ("fitted", fitted["id"], None)
    assert own.get(f"{URL}/calibrators/{fitted['id']}/report").status_code == 200
    # The server embeds a model collection's queries itself.
    assert own.post("/v1/collections", json={"name": "kb"}).status_code == 201
    problem = assert_problem(
        own.post("/v1/collections/kb/calibrators", json={"query_vectors": vectors})
    )
    assert field_of(problem) == "query_vectors"


def test_the_judging_loop_refuses_a_collection_of_own_vectors(own: TestClient):
    problem = assert_problem(own.get(f"{URL}/judging/next", params={"k": 5}))
    assert "feedback" in problem["detail"]


def test_a_collection_of_own_vectors_survives_a_restart(
    settings: Settings, embedder: Any
):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        fill(client)
        vector = query_vectors(client)[QUERIES["python"]]
    with TestClient(create_app(settings, embedder=embedder)) as client:
        r = client.post(f"{URL}/search", json={"vector": vector, "k": 1})
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "python"
        assert client.get(URL).json()["embedding"] == "client"


@pytest.mark.parametrize("storage", ["local"])  # snapshots are the local backend's
def test_a_snapshot_of_own_vectors_restores(own: TestClient):
    snapshot = own.post(f"{URL}/snapshots").json()["id"]
    assert own.delete(f"{URL}/documents/paris").status_code == 204
    r = own.post(f"{URL}/snapshots/{snapshot}/restore")
    assert r.status_code == 200, r.text
    assert r.json()["embedding"] == "client" and r.json()["documents"] == len(CORPUS)
    vector = query_vectors(own)[QUERIES["paris"]]
    hits = own.post(f"{URL}/search", json={"vector": vector, "k": 1}).json()["hits"]
    assert [h["id"] for h in hits] == ["paris"]
