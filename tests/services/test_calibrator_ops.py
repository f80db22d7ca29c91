"""Managing calibrators and feedback over HTTP: list with the shipped default, switch
back to it, delete, export/import between collections, list and delete feedback.

Real model, real SQLite, real FAISS; fits are Platt on the five-document corpus.
"""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.services.paging import encode_cursor
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES

LIMITS = Limits(max_page_size=4)
JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": 1} for doc, q in QUERIES.items()
]
QUERY = QUERIES["aspirin"]


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path / "data", limits=LIMITS)


@pytest.fixture
def client(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as c:
        for name in ("kb", "other"):
            _load(c, name)
        yield c


def _load(client: TestClient, name: str) -> None:
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    r = client.put(f"/v1/collections/{name}/documents", json={"documents": docs})
    assert r.status_code == 200, r.text


def _fit(client: TestClient, name: str = "kb", *, activate: bool = True) -> str:
    r = client.post(
        f"/v1/collections/{name}/calibrators",
        json={"judgments": JUDGMENTS, "method": "platt", "k": 5, "activate": activate},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _listed(client: TestClient, name: str = "kb") -> dict[str, dict]:
    body = client.get(f"/v1/collections/{name}/calibrators").json()
    assert body["count"] == len(body["data"])
    return {c["id"]: c for c in body["data"]}


def _default_id(client: TestClient) -> str:
    (default,) = [c for c in _listed(client).values() if c["default"]]
    return str(default["id"])


def _search(client: TestClient, name: str = "kb") -> dict:
    r = client.post(f"/v1/collections/{name}/search", json={"query": QUERY, "k": 5})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _stored_active(settings: Settings, name: str = "kb") -> str | None:
    """``active_calibrator`` as SQLite holds it (what a restart would serve)."""
    with sqlite3.connect(settings.data_dir / f"{name}.sqlite3") as conn:
        row = conn.execute(
            "SELECT value FROM meta WHERE key = 'active_calibrator'"
        ).fetchone()
    return None if row is None else str(row[0]).strip('"')


# -- the shipped default -------------------------------------------------------------
def test_the_default_is_listed_and_active_on_a_fresh_collection(client):
    (default,) = _listed(client).values()
    assert default["default"] is True and default["active"] is True
    assert default["collection"] is None
    got = client.get(f"/v1/collections/kb/calibrators/{default['id']}")
    assert got.status_code == 200 and got.json()["id"] == default["id"]


def test_activating_the_default_switches_back_from_a_fit(client, settings):
    fitted = _fit(client)
    default = _default_id(client)
    listed = _listed(client)
    assert listed[fitted]["active"] and not listed[default]["active"]
    assert _search(client)["calibrator"]["id"] == fitted

    r = client.post(f"/v1/collections/kb/calibrators/{default}/activate")
    assert r.status_code == 200, r.text
    assert r.json()["default"] is True and r.json()["active"] is True
    listed = _listed(client)
    assert listed[default]["active"] and not listed[fitted]["active"]
    assert _search(client)["calibrator"]["status"] == "default"
    assert client.get("/v1/collections/kb").json()["calibrator"]["default"] is True
    assert _stored_active(settings) is None  # a restart serves the default too

    # ... and forward to the fit again.
    client.post(f"/v1/collections/kb/calibrators/{fitted}/activate")
    assert _search(client)["calibrator"]["id"] == fitted
    assert _stored_active(settings) == fitted


# -- the judging loop offered, drift ------------------------------------------------
def _drift(client: TestClient, calibrator_id: str) -> dict:
    r = client.get(f"/v1/collections/kb/calibrators/{calibrator_id}/drift")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_judging_loop_is_offered_until_the_collection_has_a_fit(client, settings):
    step = _search(client)["calibrator"]["next_step"]
    assert step["action"] == "judge" and step["url"] == "/ui/collections/kb/judge"
    assert client.get("/v1/collections/kb").json()["calibrator"]["next_step"] == step
    default = _drift(client, _default_id(client))
    assert default["status"] == "no-reference" and default["next_step"] == step
    assert default["features"] == [] and default["positive_rate"] is None
    assert default["needed"] is None  # no number of queries gives it a verdict

    fitted = _fit(client)
    ref = _search(client)["calibrator"]
    assert ref["next_step"] is None and ref["drift"] is None  # one query: no verdict
    report = _drift(client, fitted)
    assert report["status"] == "insufficient-data" and report["n_queries"] == 1
    assert report["needed"] == settings.drift_min_queries - 1
    assert report["reference_queries"] == len(JUDGMENTS) and report["reason"] is None

    # Back to the default: offered again; the fitted one serves nothing now.
    client.post(f"/v1/collections/kb/calibrators/{_default_id(client)}/activate")
    assert _search(client)["calibrator"]["next_step"] == step
    report = _drift(client, fitted)
    assert report["status"] == "insufficient-data" and report["n_queries"] == 0
    assert "does not serve" in report["reason"]


# -- delete --------------------------------------------------------------------------
def test_delete_a_fitted_calibrator(client, settings):
    kept = _fit(client)
    gone = _fit(client, activate=False)
    r = client.delete(f"/v1/collections/kb/calibrators/{gone}")
    assert r.status_code == 204 and r.content == b""
    assert set(_listed(client)) == {_default_id(client), kept}
    assert_problem(client.get(f"/v1/collections/kb/calibrators/{gone}"), 404)
    assert_problem(client.delete(f"/v1/collections/kb/calibrators/{gone}"), 404)
    assert _search(client)["calibrator"]["id"] == kept
    assert _stored_active(settings) == kept


def test_delete_refuses_the_active_one_and_the_default(client, settings):
    active = _fit(client)
    default = _default_id(client)
    before = _listed(client)
    problem = assert_problem(
        client.delete(f"/v1/collections/kb/calibrators/{active}"), 409
    )
    assert "active" in problem["detail"] and "default" in problem["detail"]
    problem = assert_problem(
        client.delete(f"/v1/collections/kb/calibrators/{default}"), 409
    )
    assert "default" in problem["detail"] and "cannot be deleted" in problem["detail"]
    assert _listed(client) == before  # nothing changed
    assert _search(client)["calibrator"]["id"] == active
    assert _stored_active(settings) == active
    # Once the default serves, the former active one can go.
    client.post(f"/v1/collections/kb/calibrators/{default}/activate")
    assert client.delete(f"/v1/collections/kb/calibrators/{active}").status_code == 204


def test_unknown_calibrator_or_collection_is_404(client):
    for method, path in [
        ("DELETE", "/v1/collections/kb/calibrators/nope"),
        ("POST", "/v1/collections/kb/calibrators/nope/activate"),
        ("GET", "/v1/collections/kb/calibrators/nope/export"),
        ("GET", "/v1/collections/kb/calibrators/nope/drift"),
        ("GET", "/v1/collections/missing/calibrators/nope/drift"),
        ("DELETE", "/v1/collections/missing/calibrators/nope"),
        ("GET", "/v1/collections/missing/feedback"),
        ("DELETE", "/v1/collections/missing/feedback"),
    ]:
        assert_problem(client.request(method, path), 404)


# -- export / import -----------------------------------------------------------------
def test_export_then_import_serves_identical_probabilities(client):
    fitted = _fit(client)
    exported = client.get(f"/v1/collections/kb/calibrators/{fitted}/export")
    assert exported.status_code == 200, exported.text
    profile = exported.json()
    assert profile["id"] == fitted and profile["format"] >= 1
    assert profile["model"] == client.get("/v1/collections/kb").json()["model"]

    r = client.post(
        "/v1/collections/other/calibrators/import", json={"profile": profile}
    )
    assert r.status_code == 201, r.text
    imported = r.json()
    assert imported["id"] != fitted and imported["collection"] == "other"
    assert imported["active"] is False and imported["method"] == "platt"
    assert _search(client, "other")["calibrator"]["default"] is True
    client.post(f"/v1/collections/other/calibrators/{imported['id']}/activate")

    here, there = _search(client, "kb"), _search(client, "other")
    assert there["calibrator"]["id"] == imported["id"]
    assert [(h["id"], h["probability"]) for h in there["hits"]] == [
        (h["id"], h["probability"]) for h in here["hits"]
    ]
    assert there["confidence"] == here["confidence"]


def test_import_can_activate_and_the_default_exports_too(client):
    default = _default_id(client)
    profile = client.get(f"/v1/collections/kb/calibrators/{default}/export").json()
    assert profile["default"] is True
    r = client.post(
        "/v1/collections/other/calibrators/import",
        json={"profile": profile, "activate": True},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["active"] is True and body["default"] is False
    assert _search(client, "other")["calibrator"]["id"] == body["id"]


def test_a_fit_records_the_model_identity_and_import_checks_it(client, embedder):
    profile = client.get(f"/v1/collections/kb/calibrators/{_fit(client)}/export")
    profile = profile.json()
    assert profile["model_id"] == embedder.model_id
    other = {**profile, "model_id": "sha256:0000000000000000"}
    problem = assert_problem(
        client.post("/v1/collections/other/calibrators/import", json={"profile": other})
    )
    assert "sha256:0000000000000000" in problem["detail"]
    assert embedder.model_id in problem["detail"]


def test_a_profile_without_an_identity_is_imported_by_its_model_name(client):
    profile = client.get(f"/v1/collections/kb/calibrators/{_fit(client)}/export")
    older = {k: v for k, v in profile.json().items() if k != "model_id"}
    r = client.post("/v1/collections/other/calibrators/import", json={"profile": older})
    assert r.status_code == 201, r.text
    again = client.get(f"/v1/collections/other/calibrators/{r.json()['id']}/export")
    assert again.json()["model_id"] is None  # not stamped behind the user's back


def _bad_profiles(profile: dict) -> dict[str, dict]:
    return {
        "another model": {**profile, "model": "acme/other-model"},
        "another identity": {**profile, "model_id": "sha256:0000000000000000"},
        "no model": {k: v for k, v in profile.items() if k != "model"},
        "unknown format": {**profile, "format": 999},
        "missing field": {k: v for k, v in profile.items() if k != "estimator"},
        "estimator not an object": {**profile, "estimator": 3},
        "unknown estimator class": {
            **profile,
            "estimator": {**profile["estimator"], "class": "os.system"},
        },
        "bad estimator params": {
            **profile,
            "estimator": {**profile["estimator"], "params": {"bogus": 1}},
        },
        "not a profile": {"model": profile["model"], "hello": "world"},
        "bad report": {**profile, "report": []},
    }


BAD_CASES = list(_bad_profiles({"model": "m", "estimator": {}}))


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_import_is_422_and_changes_nothing(client, settings, case):
    fitted = _fit(client)
    profile = client.get(f"/v1/collections/kb/calibrators/{fitted}/export").json()
    before = _listed(client, "other")
    problem = assert_problem(
        client.post(
            "/v1/collections/other/calibrators/import",
            json={"profile": _bad_profiles(profile)[case], "activate": True},
        ),
        422,
    )
    if "model" in case:
        assert "acme/other-model" in problem["detail"] or "None" in problem["detail"]
        assert "embedding model" in problem["detail"]
    assert _listed(client, "other") == before
    assert _stored_active(settings, "other") is None


# -- feedback ------------------------------------------------------------------------
def _post_feedback(client: TestClient, judgments: list[dict]) -> None:
    r = client.post("/v1/collections/kb/feedback", json={"judgments": judgments})
    assert r.status_code == 201, r.text


def _all_pages(client: TestClient, limit: int) -> list[dict]:
    rows: list[dict] = []
    cursor = None
    for _ in range(100):  # bounded: far more pages than the test stores
        params = {"limit": limit} | ({} if cursor is None else {"cursor": cursor})
        r = client.get("/v1/collections/kb/feedback", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["count"] == len(page["data"]) <= limit
        rows += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows
        assert page["count"] == limit  # only the last page is short
    raise AssertionError("paging never ended")


def _labels(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in ("query", "document_id", "relevance")} for r in rows]


def test_feedback_is_listed_in_pages(client):
    empty = client.get("/v1/collections/kb/feedback").json()
    assert empty == {"data": [], "count": 0, "next_cursor": None}
    _post_feedback(client, JUDGMENTS)
    _post_feedback(client, JUDGMENTS[:2])
    expected = [*JUDGMENTS, *JUDGMENTS[:2]]
    for limit in (1, 3, LIMITS.max_page_size):
        rows = _all_pages(client, limit)
        assert _labels(rows) == expected
        assert all(r["created_at"] > 0 for r in rows)
    # A page that ends exactly at the end has no next page.
    _post_feedback(client, JUDGMENTS[:1])  # 8 in all: two full pages of 4
    last = client.get(
        "/v1/collections/kb/feedback",
        params={"limit": 4, "cursor": _cursor_after(client, 4)},
    ).json()
    assert last["count"] == 4 and last["next_cursor"] is None


def _cursor_after(client: TestClient, n: int) -> str:
    page = client.get("/v1/collections/kb/feedback", params={"limit": n}).json()
    return str(page["next_cursor"])


def test_a_page_cursor_is_stable_under_deletes_and_additions(client):
    _post_feedback(client, JUDGMENTS)
    cursor = _cursor_after(client, 2)
    # The first page's judgments go away, new ones arrive: nothing after is skipped.
    r = client.request(
        "DELETE", "/v1/collections/kb/feedback", params={"query": JUDGMENTS[0]["query"]}
    )
    assert r.json() == {"deleted": 1}
    _post_feedback(client, JUDGMENTS[:1])
    page = client.get(
        "/v1/collections/kb/feedback",
        params={"cursor": cursor, "limit": LIMITS.max_page_size},
    ).json()
    assert _labels(page["data"]) == [*JUDGMENTS[2:], *JUDGMENTS[:1]]
    assert page["next_cursor"] is None


def test_page_limit_at_the_bound_and_past_it(client):
    _post_feedback(client, JUDGMENTS)
    at = client.get(
        "/v1/collections/kb/feedback", params={"limit": LIMITS.max_page_size}
    )
    assert at.status_code == 200 and at.json()["count"] == LIMITS.max_page_size
    past = client.get(
        "/v1/collections/kb/feedback", params={"limit": LIMITS.max_page_size + 1}
    )
    assert "limit" in assert_problem(past)["detail"]
    at_cursor_bound = client.get(
        "/v1/collections/kb/feedback", params={"cursor": encode_cursor(2**63 - 1)}
    )
    assert at_cursor_bound.status_code == 200 and at_cursor_bound.json()["data"] == []
    for params in (
        {"limit": 0},
        {"limit": "x"},
        {"cursor": "5"},
        {"cursor": encode_cursor(2**63)},  # past SQLite's integers: not a 500
        {"cursor": "dj"},
    ):
        assert_problem(client.get("/v1/collections/kb/feedback", params=params))


def test_delete_feedback_of_one_query_then_all(client):
    _post_feedback(client, [*JUDGMENTS, JUDGMENTS[0]])
    one = client.request(
        "DELETE", "/v1/collections/kb/feedback", params={"query": JUDGMENTS[0]["query"]}
    )
    assert one.status_code == 200 and one.json() == {"deleted": 2}
    none = client.request(
        "DELETE", "/v1/collections/kb/feedback", params={"query": "never judged"}
    )
    assert none.json() == {"deleted": 0}
    assert len(_all_pages(client, LIMITS.max_page_size)) == len(JUDGMENTS) - 1
    everything = client.delete("/v1/collections/kb/feedback")
    assert everything.json() == {"deleted": len(JUDGMENTS) - 1}
    assert client.get("/v1/collections/kb/feedback").json()["count"] == 0
    # A fit with no feedback left and no judgments has nothing to learn from.
    assert_problem(client.post("/v1/collections/kb/calibrators", json={}))


# -- the list and the cap ----------------------------------------------------------
def _import(client: TestClient, profile: dict, name: str = "kb"):
    return client.post(
        f"/v1/collections/{name}/calibrators/import", json={"profile": profile}
    )


def test_calibrators_are_listed_as_summaries_a_page_at_a_time(client):
    fitted = _fit(client)
    profile = client.get(f"/v1/collections/kb/calibrators/{fitted}/export").json()
    imported = [_import(client, profile).json()["id"] for _ in range(3)]
    seen, cursor, pages = [], None, 0
    while True:
        query = "limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(f"/v1/collections/kb/calibrators?{query}").json()
        assert page["count"] == len(page["data"]) <= 2
        seen += page["data"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3  # the default, a fit and three imports, two a page
    assert [c["id"] for c in seen[1:]] == [fitted, *imported]
    assert seen[0]["default"] and seen[0]["collection"] is None
    assert [c["active"] for c in seen] == [False, True, False, False, False]
    for summary in seen:  # the reports are GET .../{id}'s
        assert set(summary) == {
            "id",
            "collection",
            "method",
            "created_at",
            "active",
            "default",
        }
    full = client.get(f"/v1/collections/kb/calibrators/{fitted}").json()
    assert full["created_at"] == seen[1]["created_at"] and "report" in full
    past = assert_problem(client.get("/v1/collections/kb/calibrators?limit=5"), 422)
    assert "limit: 5 exceeds the limit of 4" in past["detail"]  # max_page_size
    assert_problem(client.get("/v1/collections/kb/calibrators?cursor=nope"), 422)


@pytest.fixture
def capped(tmp_path, embedder):
    limits = Limits(max_page_size=4, max_calibrators_per_collection=2)
    settings = Settings(data_dir=tmp_path / "data", limits=limits)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        _load(c, "kb")
        yield c


def test_calibrators_are_capped_at_the_bound_and_refused_one_past(capped):
    fitted = _fit(capped)
    profile = capped.get(f"/v1/collections/kb/calibrators/{fitted}/export").json()
    assert _import(capped, profile).status_code == 201  # the bound: 2 stored
    before = _listed(capped)
    for refused in (
        _import(capped, profile),
        capped.post(
            "/v1/collections/kb/calibrators",
            json={"judgments": JUDGMENTS, "method": "platt", "k": 5},
        ),
        capped.post(
            "/v1/collections/kb/fit-jobs",
            json={"judgments": JUDGMENTS, "method": "platt", "k": 5},
        ),
    ):
        problem = assert_problem(refused, 422)
        assert problem["type"].endswith("/limit-exceeded")
        assert "calibrators: 3 exceeds the limit of 2" in problem["detail"]
        assert "max_calibrators_per_collection" in problem["detail"]
    assert _listed(capped) == before
    jobs = capped.get("/v1/collections/kb/fit-jobs").json()["data"]
    assert len(jobs) == 1  # the first fit's: no job was started past the cap
    others = [i for i, c in before.items() if not c["default"] and not c["active"]]
    assert (
        capped.delete(f"/v1/collections/kb/calibrators/{others[0]}").status_code == 204
    )
    assert _import(capped, profile).status_code == 201  # room again
