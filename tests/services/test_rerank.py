"""``POST /v1/rerank`` over HTTP: Cohere's shape, probabilities, limits, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.conftest import assert_problem

QUERY = "does aspirin prevent heart attacks?"
DOCUMENTS = [
    "The stock market fell sharply on Monday.",
    "Low-dose aspirin lowers the risk of a first heart attack in men.",
    "A recipe for sourdough bread with a long fermentation.",
    "Aspirin and the prevention of myocardial infarction: a randomised trial.",
    "Heart attacks happen when an artery to the heart is blocked.",
]
LIMITS = Limits(
    max_rerank_documents=4,
    max_rerank_document_chars=40,
    max_rerank_total_chars=100,
    max_text_chars=50,
    max_id_chars=8,
)


@pytest.fixture
def client(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


@pytest.fixture
def limited(tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data", limits=LIMITS)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


def _rerank(client, **body):
    r = client.post("/v1/rerank", json={"query": QUERY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_shape_is_cohere_s_with_probabilities(client, embedder):
    documents = [
        DOCUMENTS[0],
        {"text": DOCUMENTS[1], "id": "b", "metadata": {"source": "pubmed"}},
        *DOCUMENTS[2:],
    ]
    body = _rerank(client, documents=documents, return_documents=True)
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    p = [r["probability"] for r in results]
    assert p == sorted(p, reverse=True)
    for r in results:
        assert r["relevance_score"] == r["probability"]
        lo, hi = r["probability_interval"]
        assert 0.0 <= lo <= r["probability"] <= hi <= 1.0
        assert r["document"]["text"] == DOCUMENTS[r["index"]]
    # score is normcal's cosine of query and document.
    q = embedder.embed([QUERY], "query").vectors[0]
    d = embedder.embed(DOCUMENTS, "document").vectors
    cosines = {r["index"]: r["score"] for r in results}
    np.testing.assert_allclose(
        [cosines[i] for i in range(len(DOCUMENTS))], d @ q, rtol=1e-5, atol=1e-6
    )
    by_index = {r["index"]: r for r in results}
    assert by_index[1]["id"] == "b"
    assert by_index[1]["document"] == {
        "text": DOCUMENTS[1],
        "id": "b",
        "metadata": {"source": "pubmed"},
    }
    assert by_index[0]["id"] is None
    # The aspirin passages are the likely ones; the bread and the market are not.
    assert {results[0]["index"], results[1]["index"]} == {1, 3}
    assert body["calibrator"]["status"] == "default"
    # the shipped default for external lists (app/profiles/external/), not search's
    assert body["calibrator"]["id"] == "default-external-all-minilm-l6-v2"
    assert body["calibrator"]["next_step"] is None
    assert body["model"] == embedder.model_name
    assert 0.0 <= body["confidence"] <= 1.0
    assert body["confidence"] >= results[0]["probability"] - 1e-12
    assert isinstance(body["abstain"], bool)


def test_top_n_returns_the_most_probable_and_their_confidence(client):
    full = _rerank(client, documents=DOCUMENTS)
    top = _rerank(client, documents=DOCUMENTS, top_n=2)
    assert top["results"] == full["results"][:2]
    assert "document" not in top["results"][0] or top["results"][0]["document"] is None
    assert top["confidence"] <= full["confidence"] + 1e-12
    assert _rerank(client, documents=DOCUMENTS, top_n=99)["results"] == full["results"]


def test_the_retriever_s_scores_are_read_relative_to_the_list(client):
    """Scores of any scale: an increasing affine map gives the same answer."""
    scores = [0.1, 0.9, 0.2, 0.8, 0.5]
    a = [{"text": t, "score": s} for t, s in zip(DOCUMENTS, scores, strict=True)]
    b = [
        {"text": t, "score": 40 * s - 7} for t, s in zip(DOCUMENTS, scores, strict=True)
    ]
    ra, rb = _rerank(client, documents=a), _rerank(client, documents=b)
    assert [r["index"] for r in ra["results"]] == [r["index"] for r in rb["results"]]
    np.testing.assert_allclose(
        [r["probability"] for r in ra["results"]],
        [r["probability"] for r in rb["results"]],
        rtol=1e-9,
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"documents": []}, "documents"),
        ({"query": "", "documents": DOCUMENTS}, "query"),
        ({"query": "   ", "documents": DOCUMENTS}, "query"),
        ({"documents": [5]}, "documents.0"),
        ({"documents": ["ok", {"text": 5}]}, "documents.1.text"),
        ({"documents": ["ok", {"text": ""}]}, "documents.1.text"),
        ({"documents": [None]}, "documents.0"),
        ({"documents": DOCUMENTS, "top_n": -1}, "top_n"),
        ({"documents": DOCUMENTS, "top_n": 0}, "top_n"),
        ({"documents": DOCUMENTS, "top_n": "3"}, "top_n"),
        (
            {"documents": [{"text": "a", "score": 1.0}, {"text": "b"}]},
            "documents.1.score",
        ),
        ({"documents": [{"text": "a", "score": "high"}]}, "documents.0.score"),
        ({"documents": [{"text": "a", "extra": 1}]}, "documents.0.extra"),
        ({"documents": DOCUMENTS, "collection": "no/such"}, "collection"),
        ({"documents": DOCUMENTS, "unknown": 1}, "unknown"),
    ],
)
def test_bad_input_is_422_naming_the_field(client, body, field):
    problem = assert_problem(client.post("/v1/rerank", json={"query": QUERY, **body}))
    assert field in _fields(problem), problem


def _fields(problem: dict) -> list[str]:
    """The fields a problem names: its detail's prefix and its errors' locations."""
    locs = [
        ".".join(str(p) for p in e["loc"] if p != "body")
        for e in problem.get("errors") or []
    ]
    return [problem["detail"].split(":")[0], *locs]


def test_an_unknown_collection_is_404(client):
    r = client.post(
        "/v1/rerank",
        json={"query": QUERY, "documents": DOCUMENTS, "collection": "nope"},
    )
    assert_problem(r, 404)


@pytest.mark.parametrize(
    ("field", "at_bound", "past"),
    [
        # documents per request: 4
        ("documents", ["a", "b", "c", "d"], ["a", "b", "c", "d", "e"]),
        # characters of one document: 40
        ("documents.1.text", ["a", "y" * 40], ["a", "y" * 41]),
        # characters of all documents: 100 (three of 30, then one past)
        ("documents", ["a" * 40, "b" * 40, "c" * 20], ["a" * 40, "b" * 40, "c" * 21]),
    ],
)
def test_document_limits_at_the_bound_and_one_past(limited, field, at_bound, past):
    assert (
        limited.post(
            "/v1/rerank", json={"query": "q", "documents": at_bound}
        ).status_code
        == 200
    )
    problem = assert_problem(
        limited.post("/v1/rerank", json={"query": "q", "documents": past})
    )
    assert problem["type"] == "/problems/limit-exceeded"
    assert field in _fields(problem)


def test_query_and_id_limits_at_the_bound_and_one_past(limited):
    ok = limited.post("/v1/rerank", json={"query": "q" * 50, "documents": ["a"]})
    assert ok.status_code == 200, ok.text
    problem = assert_problem(
        limited.post("/v1/rerank", json={"query": "q" * 51, "documents": ["a"]})
    )
    assert "query" in _fields(problem)
    doc = {"text": "a", "id": "i" * 8}
    assert (
        limited.post("/v1/rerank", json={"query": "q", "documents": [doc]}).status_code
        == 200
    )
    doc["id"] = "i" * 9
    problem = assert_problem(
        limited.post("/v1/rerank", json={"query": "q", "documents": [doc]})
    )
    assert "documents.0.id" in _fields(problem)
