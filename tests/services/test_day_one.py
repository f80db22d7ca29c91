"""Day one over HTTP with the real model: a fresh collection, the shipped default.

An off-topic question abstains, an answerable one does not; ``confidence`` is the
best returned hit's probability; ``abstain`` is exactly the day-one rule of the
profile the collection serves (``Profile.day_one_threshold``), and no rate is
claimed. The scifact case is the issue's: a medical collection asked who won the
1998 world cup (skipped without the shared data).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Settings
from calibration.profile import Profile
from tests.support.corpus import CORPUS, QUERIES, scifact_slice

OFF_TOPIC = [
    "Who won the 1998 football world cup?",
    "What is the weather in Oslo tomorrow?",
    "best pizza recipe with mozzarella",
]


@pytest.fixture
def client(tmp_path, embedder) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        yield c


def _load(client: TestClient, name: str, docs: list[dict[str, str]]) -> Profile:
    """A new collection holding ``docs``; the profile it serves (exported)."""
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    for start in range(0, len(docs), 100):
        r = client.put(
            f"/v1/collections/{name}/documents",
            json={"documents": docs[start : start + 100]},
        )
        assert r.status_code == 200, r.text
    ref = client.get(f"/v1/collections/{name}").json()["calibrator"]
    assert ref["status"] == "default" and ref["default"] is True
    exported = client.get(f"/v1/collections/{name}/calibrators/{ref['id']}/export")
    return Profile.from_json(exported.json())


def _search(client: TestClient, name: str, queries: list[str]) -> list[dict]:
    r = client.post(f"/v1/collections/{name}/search", json={"queries": queries})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def _check_day_one(result: dict, profile: Profile) -> None:
    """The day-one confidence and rule, as served."""
    threshold = profile.day_one_threshold
    assert threshold is not None
    assert result["calibrator"]["guarantee"] is None  # no rate claimed
    best = max(h["probability"] for h in result["hits"])
    assert result["confidence"] == pytest.approx(best, abs=1e-12)
    lo, hi = result["confidence_interval"]
    assert lo <= result["confidence"] <= hi
    assert result["abstain"] is (result["confidence"] < threshold)


def test_off_topic_abstains_and_answerable_does_not_on_a_fresh_collection(client):
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    profile = _load(client, "kb", docs)
    for result in _search(client, "kb", OFF_TOPIC):
        _check_day_one(result, profile)
        assert result["abstain"] is True, result["confidence"]
    for key, result in zip(
        QUERIES, _search(client, "kb", list(QUERIES.values())), strict=True
    ):
        _check_day_one(result, profile)
        assert result["hits"][0]["id"] == key
        assert result["abstain"] is False, (key, result["confidence"])
    # Other modes and a smaller k follow the same rule.
    for body in ({"mode": "hybrid"}, {"mode": "lexical"}, {"k": 1}):
        r = client.post(
            "/v1/collections/kb/search", json={"query": OFF_TOPIC[0], **body}
        ).json()
        if r["hits"]:  # lexical: no document holds a word of it
            _check_day_one(r, profile)
            assert r["abstain"] is True, body
    # Once the collection has a fit of its own, the day-one rule no longer applies.
    judgments = [
        {"query": q, "document_id": key, "relevance": 1} for key, q in QUERIES.items()
    ]
    fit = client.post(
        "/v1/collections/kb/calibrators", json={"judgments": judgments, "k": 5}
    )
    assert fit.status_code == 201, fit.text
    fitted = client.get(f"/v1/collections/kb/calibrators/{fit.json()['id']}/export")
    assert Profile.from_json(fitted.json()).day_one_threshold is None
    r = _search(client, "kb", OFF_TOPIC[:1])[0]
    assert r["calibrator"]["status"] == "fitted"


@pytest.mark.slow
def test_a_medical_collection_abstains_on_off_topic_and_keeps_what_it_finds(client):
    """The issue's case: scifact documents, a football question (0.02, abstain false
    before). Held out over the fourteen sets, 99% of answerable scifact queries were
    kept (docs/calibration.md); here at least 90% of a slice's."""
    docs, queries, judgments = scifact_slice(20, 80)
    profile = _load(client, "sci", docs)
    for result in _search(client, "sci", [*OFF_TOPIC, QUERIES["paris"]]):
        _check_day_one(result, profile)
        assert result["abstain"] is True, result["confidence"]
    relevant: dict[str, set[str]] = {}
    for j in judgments:
        relevant.setdefault(j["query"], set()).add(j["document_id"])
    kept = []
    for query, result in zip(queries, _search(client, "sci", queries), strict=True):
        _check_day_one(result, profile)
        if relevant[query] & {h["id"] for h in result["hits"]}:  # answerable
            kept.append(not result["abstain"])
    assert len(kept) >= 15
    assert sum(kept) >= 0.9 * len(kept), kept
