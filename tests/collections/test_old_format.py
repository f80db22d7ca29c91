"""A data dir written by the old layout (main at 2857050) opens with today's code.

``tests/fixtures/old_format/kb.sqlite3`` holds six documents, two feedback judgments
and an active calibrator fitted by that code with the real model (see the README
there). Served by today's app, the collection is ready, its documents read back,
search ranks with it, and the stored calibrator loads and gives probabilities.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Settings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "old_format"
CALIBRATOR = "1f36c37996a5"  # fitted and activated by the old code


@pytest.fixture
def old(tmp_path, embedder):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    shutil.copy(FIXTURE / "kb.sqlite3", data / "kb.sqlite3")  # never touch the fixture
    with TestClient(create_app(Settings(data_dir=data), embedder=embedder)) as c:
        yield c


def test_the_old_collection_is_listed_ready(old):
    listed = old.get("/v1/collections").json()
    assert [c["name"] for c in listed["data"]] == ["kb"]
    info = old.get("/v1/collections/kb").json()
    assert info["status"] == "ready" and info["documents"] == info["indexed"] == 6
    assert info["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert info["calibrator"]["id"] == CALIBRATOR and not info["calibrator"]["default"]
    assert old.get("/readyz").json()["status"] == "ready"


def test_old_documents_read_back(old):
    doc = old.get("/v1/collections/kb/documents/paris").json()
    assert doc["text"] == "Paris is the capital and largest city of France."
    assert doc["metadata"] == {"topic": "paris", "n": 2}
    assert doc["norm"] > 0 and doc["n_tokens"] > 0


def test_search_is_calibrated_by_the_stored_calibrator(old):
    r = old.post(
        "/v1/collections/kb/search",
        json={"query": "What is the capital of France?", "k": 3},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["calibrator"]["id"] == CALIBRATOR
    assert body["hits"][0]["id"] == "paris"
    probabilities = [h["probability"] for h in body["hits"]]
    assert all(p is not None and 0 <= p <= 1 for p in probabilities)
    assert probabilities == sorted(probabilities, reverse=True)
    filtered = old.post(
        "/v1/collections/kb/search",
        json={"query": "What is the capital of France?", "filter": {"n": 2}},
    )
    assert [h["id"] for h in filtered.json()["hits"]] == ["paris"]


def test_the_stored_calibrator_and_feedback_load(old):
    listed = old.get("/v1/collections/kb/calibrators").json()["data"]
    assert [
        (c["id"], c["active"], c["method"]) for c in listed if not c["default"]
    ] == [(CALIBRATOR, True, "platt")]
    info = old.get(f"/v1/collections/kb/calibrators/{CALIBRATOR}").json()
    assert info["report"]["n_queries"] == 12
    more = {"judgments": [{"query": "q", "document_id": "python", "relevance": 1}]}
    r = old.post("/v1/collections/kb/feedback", json=more)
    assert r.status_code == 201 and r.json()["total"] == 3  # two were stored before
