"""A calibration namespace: a collection with no documents, for another retriever.

Its rerank requests are logged (query log on) and judged like searched queries; a fit
from judged ``lists`` (or from the judged log) then serves its rerank requests.
"""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.collections.store_files import SCHEMA_VERSION
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES

NAMES = list(CORPUS)


def _list(i: int, *, judged: bool = True) -> dict:
    """Query ``i`` with every corpus text, as a retriever ranked them (rotated)."""
    names = NAMES[i:] + NAMES[:i]
    names = names[1:3] + names[:1] + names[3:]  # the relevant one third
    scores = [9.0, 7.5, 7.0, 3.0, 1.0]
    documents = []
    for name, score in zip(names, scores, strict=True):
        doc = {"text": CORPUS[name], "id": name, "score": score}
        if judged:
            doc["relevance"] = int(name == NAMES[i])
        documents.append(doc)
    return {"query": QUERIES[NAMES[i]], "documents": documents}


def _rerank(client, body, collection="ns"):
    r = client.post("/v1/rerank", json={**body, "collection": collection})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def settings(tmp_path):
    limits = Limits(max_logged_rerank_chars=150, max_judgments_per_fit=30)
    return Settings(data_dir=tmp_path / "data", limits=limits)


@pytest.fixture
def ns(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.post("/v1/collections", json={"name": "ns"}).status_code == 201
        yield client


def test_a_namespace_fits_from_lists_and_then_serves_its_calibrator(ns):
    before = _rerank(ns, _list(0, judged=False))
    assert before["calibrator"]["status"] == "default"
    assert before["calibrator"]["next_step"]["url"] == "/ui/collections/ns/judge"
    body = {"lists": [_list(i) for i in range(5)], "method": "auto"}
    r = ns.post("/v1/collections/ns/calibrators", json=body)
    assert r.status_code == 201, r.text
    fitted = r.json()
    assert fitted["active"] and fitted["report"]["n_queries"] == 5
    assert fitted["report"]["judged_lists"] == 5
    after = _rerank(ns, _list(0, judged=False))
    assert after["calibrator"]["status"] == "fitted"
    assert after["calibrator"]["id"] == fitted["id"]
    assert after["calibrator"]["n_queries"] == 5
    # Its own judgments: the relevant passage now leads, well above the others.
    top = after["results"][0]
    assert top["id"] == NAMES[0]
    assert top["probability"] > max(r["probability"] for r in after["results"][1:])
    # Without the collection, the shipped default still answers.
    plain = ns.post("/v1/rerank", json=_strip(_list(0, judged=False)))
    assert plain.json()["calibrator"]["status"] == "default"


def _strip(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "collection"}


def test_a_fit_from_lists_is_checked_like_any_fit(ns):
    too_few = {"lists": [_list(i) for i in range(4)]}
    problem = assert_problem(ns.post("/v1/collections/ns/calibrators", json=too_few))
    assert problem["type"] == "/problems/insufficient-data"
    # Documents of lists count toward max_judgments_per_fit (30): 7 lists of 5 = 35.
    many = {"lists": [_list(i % 5) for i in range(7)]}
    problem = assert_problem(ns.post("/v1/collections/ns/calibrators", json=many))
    assert problem["type"] == "/problems/limit-exceeded"
    bad = {"lists": [_list(i) for i in range(5)]}
    bad["lists"][2]["documents"][1]["score"] = None
    problem = assert_problem(ns.post("/v1/collections/ns/calibrators", json=bad))
    assert problem["errors"][0]["loc"][:2] == ["lists", "2"]
    for broken in ({"query": ""}, {"documents": []}, {"documents": [7]}):
        body = {"lists": [{**_list(i), **broken} for i in range(5)]}
        assert_problem(ns.post("/v1/collections/ns/calibrators", json=body))
    jobs = ns.get("/v1/collections/ns/fit-jobs").json()
    assert jobs["count"] == 0  # refused before any job
    assert ns.get("/v1/collections/ns/calibrators").json()["count"] == 1  # default


def test_logged_rerank_requests_are_judged_and_fitted(ns):
    r = ns.put("/v1/collections/ns/query-log", json={"enabled": True})
    assert r.status_code == 200, r.text
    for i in range(5):
        _rerank(ns, _list(i, judged=False))
    log = ns.get("/v1/collections/ns/query-log").json()
    assert log["entries"] == 5
    seen = set()
    for _ in range(5):
        nxt = ns.get("/v1/collections/ns/judging/next", params={"k": 3}).json()
        query = nxt["query"]
        assert query in QUERIES.values() and query not in seen
        seen.add(query)
        # The logged documents that fit max_logged_rerank_chars (150): the first two
        # or three of each list, most probable first, with the caller's ids.
        assert 1 <= len(nxt["hits"]) <= 3
        assert {h["id"] for h in nxt["hits"]} <= set(NAMES)
        relevant = next(n for n in NAMES if QUERIES[n] == query)
        judgments = [
            {
                "query": query,
                "document_id": h["id"],
                "relevance": int(h["id"] == relevant),
            }
            for h in nxt["hits"]
        ]
        if relevant not in {h["id"] for h in nxt["hits"]}:
            judgments[0]["relevance"] = 1  # every query needs one relevant somewhere
        r = ns.post("/v1/collections/ns/feedback", json={"judgments": judgments})
        assert r.status_code == 201, r.text
    done = ns.get("/v1/collections/ns/judging/next").json()
    assert done["query"] is None and done["progress"]["can_fit"]
    # A document the logged request did not have is not judgeable.
    stray = {"query": seen.pop(), "document_id": "nope", "relevance": 1}
    assert_problem(ns.post("/v1/collections/ns/feedback", json={"judgments": [stray]}))
    r = ns.post("/v1/collections/ns/calibrators", json={"method": "auto"})
    assert r.status_code == 201, r.text
    assert r.json()["report"]["judged_lists"] == 5
    assert _rerank(ns, _list(1, judged=False))["calibrator"]["status"] == "fitted"


def test_a_refused_rerank_logs_nothing(ns, settings):
    ns.put("/v1/collections/ns/query-log", json={"enabled": True})
    bad = {"query": "q", "documents": [{"text": "a", "score": 1.0}, {"text": "b"}]}
    assert_problem(ns.post("/v1/rerank", json={**bad, "collection": "ns"}))
    assert_problem(
        ns.post("/v1/rerank", json={"query": "q", "documents": [], "collection": "ns"})
    )
    assert ns.get("/v1/collections/ns/query-log").json()["entries"] == 0
    path = settings.data_dir / "ns.sqlite3"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM rerank_log").fetchone()[0] == 0


def test_the_log_keeps_its_retention_for_rerank_requests(ns, settings):
    ns.put("/v1/collections/ns/query-log", json={"enabled": True, "retention": 2})
    for i in range(4):
        _rerank(ns, _list(i, judged=False))
    assert ns.get("/v1/collections/ns/query-log").json()["entries"] == 2
    with sqlite3.connect(settings.data_dir / "ns.sqlite3") as conn:
        kept = [r[0] for r in conn.execute("SELECT query FROM rerank_log")]
    assert sorted(kept) == sorted(QUERIES[NAMES[i]] for i in (2, 3))


def test_a_version_3_file_gains_the_rerank_log(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.post("/v1/collections", json={"name": "old"}).status_code == 201
    path = settings.data_dir / "old.sqlite3"
    with sqlite3.connect(path) as conn:  # what schema version 3 wrote
        conn.execute("DROP TABLE rerank_log")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.get("/v1/collections/old").json()["status"] == "ready"
        client.put("/v1/collections/old/query-log", json={"enabled": True})
        _rerank(client, _list(0, judged=False), collection="old")
        assert client.get("/v1/collections/old/judging/next").json()["rerank"]
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert row.fetchone() == (str(SCHEMA_VERSION),)
    conn.close()


def test_a_fit_job_fits_judged_lists_too(ns):
    body = {"lists": [_list(i) for i in range(5)], "method": "platt"}
    r = ns.post("/v1/collections/ns/fit-jobs", json=body)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    for _ in range(600):  # polled, bounded: the job runs in the app's own loop
        job = ns.get(f"/v1/collections/ns/fit-jobs/{job_id}").json()
        if job["status"] in {"succeeded", "failed"}:
            break
    assert job["status"] == "succeeded", job
    assert job["calibrator"]["method"] == "platt"
    assert _rerank(ns, _list(2, judged=False))["calibrator"]["status"] == "fitted"


def test_a_request_whose_first_document_is_too_long_to_keep_is_not_logged(ns):
    ns.put("/v1/collections/ns/query-log", json={"enabled": True})
    long = {"query": "q", "documents": ["x" * 151, "short"], "collection": "ns"}
    assert ns.post("/v1/rerank", json=long).status_code == 200  # answered
    assert ns.get("/v1/collections/ns/query-log").json()["entries"] == 0
    fits = {"query": "q", "documents": ["x" * 150, "short"], "collection": "ns"}
    assert ns.post("/v1/rerank", json=fits).status_code == 200  # at the bound
    assert ns.get("/v1/collections/ns/query-log").json()["entries"] == 1
    nxt = ns.get("/v1/collections/ns/judging/next").json()
    assert [h["text"] for h in nxt["hits"]] == ["x" * 150]
