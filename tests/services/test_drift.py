"""Drift over HTTP on a real scifact slice (real model, SQLite, FAISS).

A calibrator is fitted on 40 judged queries; searches of 80 other queries of the same
set (their relevant documents are in the collection too) must read ``ok``, then long
off-topic queries must flip it to ``drifting`` naming the features that moved. The
small-corpus checks (the judging loop offered until a fit, ``no-reference``, 404s) are
in ``test_calibrator_ops.py``.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Settings
from calibration.drift import DRIFT_FEATURES
from tests.support.corpus import scifact_slice

pytestmark = pytest.mark.slow

N_JUDGED = 40
N_SERVED = 80
WINDOW = 60
MIN_QUERIES = 30
BATCH = 20
# Long queries about nothing the collection holds.
OFF_TOPIC = (
    "The referee blew the whistle as the striker curled the free kick over the wall",
    "Slow-cook the lamb shoulder with rosemary, garlic and a glass of red wine",
    "The orchestra tuned up while the conductor waited for the audience to settle",
    "Our hiking route climbs past the waterfall and follows the ridge to the summit",
    "The vintage motorcycle needed a new carburettor before the weekend rally",
    "She painted the harbour at dawn, when the fishing boats were heading out",
)


@pytest.fixture(scope="module")
def scifact():
    """Documents, query texts in order, and the judgments of the first 40."""
    docs, queries, judgments = scifact_slice(N_JUDGED + N_SERVED, 100)
    judged = set(queries[:N_JUDGED])
    return docs, queries, [j for j in judgments if j["query"] in judged]


@pytest.fixture(scope="module")
def client(tmp_path_factory, embedder, scifact):
    docs, _, _ = scifact
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("drift"),
        drift_window=WINDOW,
        drift_min_queries=MIN_QUERIES,
    )
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert c.post("/v1/collections", json={"name": "sci"}).status_code == 201
        for start in range(0, len(docs), 128):
            r = c.put(
                "/v1/collections/sci/documents",
                json={"documents": docs[start : start + 128]},
            )
            assert r.status_code == 200, r.text
        yield c


def _search(client: TestClient, queries: list[str]) -> list[dict]:
    results = []
    for start in range(0, len(queries), BATCH):
        r = client.post(
            "/v1/collections/sci/search",
            json={"queries": queries[start : start + BATCH], "k": 5},
        )
        assert r.status_code == 200, r.text
        results += r.json()["results"]
    return results


def _drift(client: TestClient, calibrator_id: str) -> dict:
    r = client.get(f"/v1/collections/sci/calibrators/{calibrator_id}/drift")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _off_topic(n: int) -> list[str]:
    """``n`` distinct long queries: each a few off-topic sentences."""
    return [
        ". ".join(OFF_TOPIC[(i + j) % len(OFF_TOPIC)] for j in range(4)) + f" ({i})"
        for i in range(n)
    ]


def test_queries_like_the_judged_ones_are_ok_and_a_shift_is_drifting(client, scifact):
    _, queries, judgments = scifact
    served = queries[N_JUDGED:]

    fit = client.post("/v1/collections/sci/calibrators", json={"judgments": judgments})
    assert fit.status_code == 201, fit.text
    cid = fit.json()["id"]
    reference = fit.json()["report"]["drift_reference"]
    assert reference["n_queries"] == N_JUDGED
    assert [f["name"] for f in reference["features"]] == list(DRIFT_FEATURES)

    # Below the minimum: insufficient data, with the count still needed.
    report = _drift(client, cid)
    assert report["status"] == "insufficient-data"
    assert (report["n_queries"], report["needed"]) == (0, MIN_QUERIES)
    results = _search(client, served[: MIN_QUERIES - 1])
    assert all(r["calibrator"]["drift"] is None for r in results)
    report = _drift(client, cid)
    assert report["status"] == "insufficient-data" and report["needed"] == 1
    assert report["since"] is not None and report["reference_queries"] == N_JUDGED

    # At the minimum, then past the window: queries like the judged ones are ok.
    _search(client, served[MIN_QUERIES - 1 : MIN_QUERIES])
    report = _drift(client, cid)
    assert report["status"] == "ok" and report["moved"] == [], report
    _search(client, served[MIN_QUERIES:])
    report = _drift(client, cid)
    assert report["status"] == "ok" and report["n_queries"] == WINDOW, report
    assert {f["feature"] for f in report["features"]} == {
        f["name"] for f in reference["features"]
    }
    (last,) = _search(client, served[:1])
    assert last["calibrator"]["drift"] == "ok"

    # Long off-topic queries fill the window: drifting, naming what moved.
    _search(client, _off_topic(WINDOW))
    report = _drift(client, cid)
    assert report["status"] == "drifting"
    moved = {f["feature"] for f in report["features"] if f["moved"]}
    assert {"query_tokens", "top_cosine"} <= moved
    assert set(report["moved"]) - {"positive_rate"} == moved
    (last,) = _search(client, served[:1])
    assert last["calibrator"]["drift"] == "drifting"
    metrics = client.get("/metrics").text
    assert 'normcal_calibrator_drifting{collection="sci"} 1.0' in metrics
    assert 'normcal_calibrator_drift_psi{collection="sci",feature="query_tokens"}' in (
        metrics
    )
