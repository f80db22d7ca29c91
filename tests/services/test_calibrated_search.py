"""Calibrated search end to end over HTTP on a real scifact slice (real model)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Settings
from tests.conftest import assert_problem
from tests.support.corpus import scifact_slice

# A scifact slice ingested, then calibrators fitted on it: minutes, not seconds.
pytestmark = pytest.mark.slow

N_QUERIES = 40
N_DISTRACTORS = 160


@pytest.fixture(scope="module")
def scifact():
    """Judgments of 40 train queries and a corpus slice holding their relevant docs."""
    docs, _, judgments = scifact_slice(N_QUERIES, N_DISTRACTORS)
    return docs, judgments


def _load(client: TestClient, name: str, docs: list[dict[str, str]]) -> None:
    """Create collection ``name`` holding ``docs``."""
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    for start in range(0, len(docs), 128):
        r = client.put(
            f"/v1/collections/{name}/documents",
            json={"documents": docs[start : start + 128]},
        )
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def client(tmp_path_factory, embedder, scifact):
    """One app for the module; tests that store feedback use their own collection,
    since stored feedback joins every later fit of ``sci`` (include_feedback)."""
    docs, _ = scifact
    settings = Settings(data_dir=tmp_path_factory.mktemp("calibrated"))
    with TestClient(create_app(settings, embedder=embedder)) as c:
        _load(c, "sci", docs)
        yield c


@pytest.fixture(scope="module")
def fitted(client, scifact):
    _, judgments = scifact
    r = client.post(
        "/v1/collections/sci/calibrators", json={"judgments": judgments, "k": 10}
    )
    assert r.status_code == 201, r.text
    return r.json()


def _active(client):
    return client.get("/v1/collections/sci").json()["calibrator"]


def test_default_profile_serves_a_fresh_collection(client, scifact):
    docs, _ = scifact
    _load(client, "fresh", docs[:20])  # "sci" gets a fitted calibrator in this module
    r = client.post(
        "/v1/collections/fresh/search", json={"query": "vitamin D and bone"}
    )
    body = r.json()
    assert body["calibrator"]["default"] is True
    assert body["hits"] and all(0 <= h["probability"] <= 1 for h in body["hits"])
    assert 0 <= body["confidence"] <= 1 and isinstance(body["abstain"], bool)


def test_fresh_collection_is_default_with_intervals_and_no_guarantee(client, scifact):
    """No judgments from the collection: the shipped prior, honest about its level."""
    docs, _ = scifact
    _load(client, "fresh2", docs[:30])
    body = client.post(
        "/v1/collections/fresh2/search", json={"query": "vitamin D and bone", "k": 5}
    ).json()
    ref = body["calibrator"]
    assert ref["status"] == "default" and ref["guarantee"] is None
    assert ref["n_queries"] is None and ref["method"] == "prior"
    for h in body["hits"]:
        lo, hi = h["probability_interval"]
        assert 0 <= lo <= h["probability"] <= hi <= 1 and hi - lo > 0.05
    lo, hi = body["confidence_interval"]
    ps = [h["probability"] for h in body["hits"]]
    assert lo <= body["confidence"] <= hi
    # Day one: the confidence is the best hit's probability; abstain reads the level
    # interval (tests/services/test_day_one.py).
    assert body["confidence"] == pytest.approx(max(ps), abs=1e-12)


def test_confidence_is_that_of_the_hits_returned(client, scifact):
    """Non-decreasing in k over HTTP, and recomputed after a probability cut."""
    docs, _ = scifact
    _load(client, "fresh3", docs[:30])
    url = "/v1/collections/fresh3/search"
    confidences = [
        client.post(url, json={"query": "vitamin D and bone", "k": k}).json()[
            "confidence"
        ]
        for k in (1, 3, 10)
    ]
    assert confidences == sorted(confidences)
    full = client.post(url, json={"query": "vitamin D and bone", "k": 10}).json()
    cut_at = sorted(h["probability"] for h in full["hits"])[-2]
    cut = client.post(
        url, json={"query": "vitamin D and bone", "k": 10, "min_probability": cut_at}
    ).json()
    ps = [h["probability"] for h in cut["hits"]]
    assert len(ps) < len(full["hits"])
    assert max(ps) - 1e-12 <= cut["confidence"] <= min(1.0, sum(ps)) + 1e-12
    assert cut["confidence"] <= full["confidence"]


class _Renamed:
    """The session embedder under another model name (no shipped profile for it)."""

    def __init__(self, inner, name: str):
        self._inner = inner
        self.model_name = name

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


def test_model_without_a_shipped_profile_gets_the_agnostic_default(
    tmp_path, embedder, scifact
):
    docs, _ = scifact
    settings = Settings(data_dir=tmp_path)
    app = create_app(settings, embedder=_Renamed(embedder, "acme/other-model"))
    with TestClient(app) as c:
        _load(c, "other", docs[:20])
        body = c.post("/v1/collections/other/search", json={"query": "bone"}).json()
        info = c.get("/v1/collections/other").json()
    ref = body["calibrator"]
    assert ref["status"] == "default" and ref["id"] == "default-model-agnostic"
    assert "acme/other-model" in ref["reason"] and ref["guarantee"] is None
    assert info["calibrator"] == ref
    assert all(h["probability_interval"] is not None for h in body["hits"])
    assert body["confidence_interval"] is not None


def test_fit_reports_every_method_and_norm_lift(fitted):
    """The shipped prior joins the candidates of a collection's fit."""
    assert fitted["method"] in {"prior", "platt", "isotonic", "nt", "nt-list"}
    assert set(fitted["cv"]) == {"prior", "platt", "isotonic", "nt", "nt-list"}
    for m in fitted["cv"].values():
        assert 0 <= m["brier"] <= 1 and m["nll"] > 0 and 0 <= m["auroc"] <= 1
    assert {"nll_with", "nll_without", "terms", "reason"} <= set(fitted["norm_lift"])
    assert fitted["report"]["n_queries"] == N_QUERIES
    assert fitted["active"] is True and fitted["default"] is False
    # Document-side evidence (BM25) is allowed by default.
    assert fitted["report"]["allow_reorder"] is True


def test_fit_response_names_why_its_method_was_chosen(client, fitted):
    """The rules behind the choice are data in the response, stored and returned by
    GET: the one-SE rule, the ECE and rank guards and the recalibration stage, in
    that order."""
    why = fitted["selection"]
    assert why["chosen"] == fitted["method"]
    rules = [r["rule"] for r in why["rules"]]
    assert rules == ["one-se", "ece-guard", "rank-guard", "recalibration"]
    assert all(r["outcome"] and r["detail"] for r in why["rules"])
    stage = why["rules"][-1]
    assert why["recalibrated"] is (stage["outcome"] == "applied")
    assert stage["detail"].startswith(f"{why['chosen']} recalibrated")
    assert set(why["recalibrated_cv"]) == set(fitted["cv"])
    served = why["served"]
    assert 0 <= served["ece"] <= 1 and served["nll"] > 0 and why["ece_noise_floor"] > 0
    assert fitted["report"]["selection"]["rules"] == why["rules"]
    url = f"/v1/collections/sci/calibrators/{fitted['id']}"
    assert client.get(url).json()["selection"] == why
    page = client.get(f"{url}/report").text  # the report page shows them too
    rows = re.findall(r"<tr><td>([a-z-]+)</td><td>([^<]+)</td>", page)
    assert rows[: len(why["rules"])] == [
        (r["rule"], r["outcome"]) for r in why["rules"]
    ]


def test_a_named_method_says_it_was_requested(client, scifact):
    _, judgments = scifact
    r = client.post(
        "/v1/collections/sci/calibrators",
        json={"judgments": judgments, "k": 10, "method": "platt", "activate": False},
    )
    assert r.status_code == 201, r.text
    why = r.json()["selection"]
    assert why["chosen"] == "platt" and why["recalibrated"] is False
    assert [(x["rule"], x["outcome"]) for x in why["rules"]] == [
        ("requested", "served as asked")
    ]


def test_a_query_side_fit_never_reorders_hits(client, fitted, scifact):
    """allow_reorder false: no lexical or document-side model, not even the prior."""
    _, judgments = scifact
    r = client.post(
        "/v1/collections/sci/calibrators",
        json={
            "judgments": judgments,
            "k": 10,
            "allow_reorder": False,
            "activate": False,
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["reorders_hits"] is False and body["report"]["allow_reorder"] is False
    assert "prior" not in body["cv"]  # the shipped prior carries BM25 terms


def test_search_is_calibrated_by_the_fitted_calibrator(client, fitted, scifact):
    _, judgments = scifact
    r = client.post(
        "/v1/collections/sci/search",
        json={
            "queries": [judgments[0]["query"], "unrelated: recipe for apple pie"],
            "k": 10,
        },
    )
    assert r.status_code == 200, r.text
    for result in r.json()["results"]:
        policy = fitted["abstain"]
        guarantee = (
            {
                "target": policy["target_risk"],
                "delta": policy["delta"],
                "n_queries": policy["n_calibration"],
            }
            if policy["certified"]
            else None
        )
        assert result["calibrator"] == {
            "status": "fitted",
            "id": fitted["id"],
            "method": fitted["method"],
            "default": False,
            "reorders_hits": fitted["reorders_hits"],
            "n_queries": N_QUERIES,
            "guarantee": guarantee,
            "reason": None,
            "drift": None,  # too few queries served yet for a verdict
            "next_step": None,  # the collection has its own fit
        }
        if guarantee is not None:  # the certified threshold decides abstain
            assert result["abstain"] is (result["confidence"] < policy["threshold"])
        hits = result["hits"]
        assert all(0 <= h["probability"] <= 1 for h in hits)
        assert [h["score"] for h in hits] == sorted(
            (h["score"] for h in hits), reverse=True
        )
        assert 0 <= result["confidence"] <= 1 and isinstance(result["abstain"], bool)
    on_topic, off_topic = r.json()["results"]
    assert on_topic["confidence"] > off_topic["confidence"]
    assert on_topic["hits"][0]["probability"] > off_topic["hits"][0]["probability"]


def test_min_probability_and_target_precision(client, fitted, scifact):
    _, judgments = scifact
    query = judgments[0]["query"]
    full = client.post(
        "/v1/collections/sci/search", json={"query": query, "k": 10}
    ).json()
    threshold = full["hits"][2]["probability"]
    cut = client.post(
        "/v1/collections/sci/search",
        json={"query": query, "k": 10, "min_probability": threshold},
    ).json()
    assert len(cut["hits"]) >= 3
    assert all(h["probability"] >= threshold for h in cut["hits"])
    target = 0.5 * (full["hits"][0]["probability"] + full["hits"][1]["probability"])
    prefix = client.post(
        "/v1/collections/sci/search",
        json={"query": query, "k": 10, "target_precision": target},
    ).json()["hits"]
    probs = [h["probability"] for h in prefix]
    assert probs and sum(probs) / len(probs) >= target
    assert [h["id"] for h in prefix] == [h["id"] for h in full["hits"][: len(prefix)]]


def test_report_png_and_list(client, fitted):
    listed = client.get("/v1/collections/sci/calibrators").json()
    assert fitted["id"] in [c["id"] for c in listed["data"]]
    assert (
        client.get(f"/v1/collections/sci/calibrators/{fitted['id']}").json()["id"]
        == fitted["id"]
    )
    png = client.get(f"/v1/collections/sci/calibrators/{fitted['id']}/reliability.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n" and len(png.content) > 5000
    page = client.get(f"/v1/collections/sci/calibrators/{fitted['id']}/report")
    assert page.status_code == 200 and page.headers["content-type"].startswith(
        "text/html"
    )
    assert page.text.count('<tr class="method') == 5 and "reliability.png" in page.text
    # The evidence ladder: what list, length, lexical and norm terms bought here.
    for group in ("list", "length", "lexical", "residual norm"):
        assert f"<td>{group}</td>" in page.text
    assert_problem(client.get("/v1/collections/sci/calibrators/nope"), 404)
    assert_problem(
        client.get("/v1/collections/sci/calibrators/nope/reliability.png"), 404
    )


def test_switching_calibrators(client, fitted, scifact):
    _, judgments = scifact
    r = client.post(
        "/v1/collections/sci/calibrators",
        json={"judgments": judgments, "k": 10, "method": "platt", "activate": False},
    )
    assert r.status_code == 201 and r.json()["method"] == "platt"
    platt = r.json()["id"]
    assert _active(client)["id"] == fitted["id"]
    assert (
        client.post(f"/v1/collections/sci/calibrators/{platt}/activate").status_code
        == 200
    )
    query = {"query": judgments[0]["query"]}
    assert (
        client.post("/v1/collections/sci/search", json=query).json()["calibrator"]["id"]
        == platt
    )
    client.post(f"/v1/collections/sci/calibrators/{fitted['id']}/activate")
    assert _active(client)["id"] == fitted["id"]


@pytest.mark.parametrize(
    "case",
    ["unknown-document", "all-negative", "all-positive", "too-few-queries", "none"],
)
def test_bad_judgments_are_4xx_and_change_nothing(client, fitted, scifact, case):
    _, judgments = scifact
    before = _active(client)
    count = client.get("/v1/collections/sci/calibrators").json()["count"]
    if case == "unknown-document":
        body = {
            "judgments": [
                *judgments,
                {"query": "q", "document_id": "no-such-doc", "relevance": 1},
            ]
        }
    elif case == "all-negative":
        body = {"judgments": [{**j, "relevance": 0} for j in judgments]}
    elif case == "all-positive":
        # Judge every candidate of each query's fit pool (dense top-2 and BM25 top-2)
        # relevant: no negative pair is left.
        queries = sorted({j["query"] for j in judgments})[:10]
        found = [
            client.post(
                "/v1/collections/sci/search",
                json={"queries": queries, "k": 2, "mode": mode},
            ).json()["results"]
            for mode in ("dense", "lexical")
        ]
        body = {
            "k": 2,
            "include_feedback": False,
            "judgments": [
                {"query": q, "document_id": h["id"], "relevance": 1}
                for results in found
                for q, res in zip(queries, results, strict=True)
                for h in res["hits"]
            ],
        }
    elif case == "too-few-queries":
        three = sorted({j["query"] for j in judgments})[:3]
        body = {"judgments": [j for j in judgments if j["query"] in three]}
    else:
        body = {"judgments": [], "include_feedback": False}
    problem = assert_problem(client.post("/v1/collections/sci/calibrators", json=body))
    assert problem["detail"]
    if case == "unknown-document":
        assert "no-such-doc" in problem["detail"]
    assert _active(client) == before
    assert client.get("/v1/collections/sci/calibrators").json()["count"] == count


def test_feedback_feeds_the_next_fit(client, scifact):
    docs, judgments = scifact
    _load(client, "fb", docs)  # not "sci": its fits must not see this feedback
    bad = client.post(
        "/v1/collections/fb/feedback",
        json={"judgments": [{"query": "q", "document_id": "nope", "relevance": 1}]},
    )
    assert_problem(bad)
    r = client.post("/v1/collections/fb/feedback", json={"judgments": judgments})
    assert r.status_code == 201 and r.json() == {
        "stored": len(judgments),
        "total": len(judgments),
    }
    fit = client.post(
        "/v1/collections/fb/calibrators",
        json={"judgments": [], "k": 10, "method": "platt", "activate": False},
    )
    assert fit.status_code == 201, fit.text
    assert fit.json()["report"]["n_queries"] == N_QUERIES


def test_calibrators_survive_restart(tmp_path, embedder, scifact):
    docs, judgments = scifact
    settings = Settings(data_dir=tmp_path)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        _load(c, "sci", docs)
        fitted = c.post(
            "/v1/collections/sci/calibrators",
            json={"judgments": judgments, "k": 5, "method": "nt"},
        ).json()
        before = c.post(
            "/v1/collections/sci/search", json={"query": judgments[1]["query"]}
        ).json()
    with TestClient(create_app(settings, embedder=embedder)) as c:
        after = c.post(
            "/v1/collections/sci/search", json={"query": judgments[1]["query"]}
        ).json()
        assert after["calibrator"]["id"] == fitted["id"]
        # The same calibrator on the same query; the query's vector may differ in
        # its last float32 bits (before the restart the embedding cache held the
        # fit's pass of it, padded with other queries; after, it is embedded alone).
        assert [h["id"] for h in after["hits"]] == [h["id"] for h in before["hits"]]
        assert [h["probability"] for h in after["hits"]] == pytest.approx(
            [h["probability"] for h in before["hits"]], rel=1e-5, abs=1e-7
        )
