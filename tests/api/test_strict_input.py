"""Unknown input is refused, naming it: query parameters on every route, and the body
fields of other vector stores' habits with the field to use instead.

The routes are read from the app itself (``check_route_roles``), so a route added
later is covered without being listed here.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.api.auth import check_route_roles
from app.api.strict import HABITS
from tests.conftest import assert_problem

pytestmark = pytest.mark.fake_embedder

URL = "/v1/collections/kb"
PARAMS = {
    "name": "kb",
    "doc_id": "d1",
    "calibrator_id": "default",
    "snapshot_id": "20250101T000000000Z-0123abcd",
    "job_id": "job1",
    "file": "judge.js",
}


@pytest.fixture
def kb(client: TestClient) -> TestClient:
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    docs = [
        {"id": "d1", "text": "aspirin and the heart", "metadata": {"year": 2001}},
        {"id": "d2", "text": "paris is in france", "metadata": {"year": 1999}},
    ]
    assert client.put(f"{URL}/documents", json={"documents": docs}).is_success
    return client


def _state(c: TestClient) -> object:
    return (
        c.get("/v1/collections").json(),
        c.get(f"{URL}/documents").json(),
        c.get(f"{URL}/calibrators").json(),
    )


def test_every_route_refuses_a_query_parameter_it_does_not_declare(kb):
    before = _state(kb)
    wrong = []
    routes = check_route_roles(kb.app)
    for route in routes:
        method, path = route.split(" ", 1)
        path = re.sub(r"\{(\w+)(:path)?\}", lambda m: PARAMS[m.group(1)], path)
        body = {} if method in {"POST", "PUT", "PATCH"} else None
        r = kb.request(method, f"{path}?normcal_bogus=1", json=body)
        if path == "/openapi.json":  # the framework's own route: no dependencies
            continue
        problem = r.json() if r.status_code == 422 else {}
        if (
            problem.get("type") != "/problems/validation-error"
            or problem["errors"][0]["loc"] != ["query", "normcal_bogus"]
            or "unknown query parameter" not in problem["detail"]
        ):
            wrong.append(f"{route}: {r.status_code} {r.text[:200]}")
    assert wrong == []
    assert len(routes) >= 50
    assert _state(kb) == before


def test_the_refusal_names_each_unknown_parameter_and_what_the_route_takes(kb):
    problem = assert_problem(kb.get(f"{URL}/documents?limit=1&foo=1&bar=2"))
    assert [e["loc"] for e in problem["errors"]] == [["query", "foo"], ["query", "bar"]]
    assert "(this route takes cursor, limit)" in problem["detail"]
    assert kb.get(f"{URL}/documents?limit=1").json()["count"] == 1
    # The case: a filter in the query string no longer returns everything.
    problem = assert_problem(kb.get(f"{URL}/documents", params={"filter": "{}"}))
    assert "POST .../documents/query" in problem["detail"]
    assert_problem(kb.get("/healthz?verbose=1"))
    assert kb.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "field", "use"),
    [
        ("search", {"query": "aspirin", "top_k": 2}, "top_k", "k"),
        ("search", {"query": "aspirin", "n_results": 2}, "n_results", "k"),
        ("search", {"query": "aspirin", "where": {"year": 2001}}, "where", "filter"),
        ("search", {"query_texts": ["aspirin"]}, "query_texts", "queries"),
        (
            "search",
            {"query": "a", "score_threshold": 0.5},
            "score_threshold",
            "min_probability",
        ),
        ("documents/query", {"top_k": 2}, "top_k", "limit"),
        ("documents/query", {"where": {"year": 2001}}, "where", "filter"),
        ("documents/query", {"offset": 10}, "offset", "cursor"),
        ("documents/count", {"where": {"year": 2001}}, "where", "filter"),
        (
            "documents",
            {"documents": [{"id": "x", "page_content": "t"}]},
            "documents.0.page_content",
            "text",
        ),
        (
            "documents",
            {"documents": [{"id": "x", "text": "t", "payload": {}}]},
            "documents.0.payload",
            "metadata",
        ),
    ],
)
def test_another_stores_field_names_the_field_to_use(kb, path, body, field, use):
    before = _state(kb)
    send = kb.put if path == "documents" else kb.post
    problem = assert_problem(send(f"{URL}/{path}", json=body))
    # The hint comes first, even before the required field it stands for.
    assert problem["detail"].startswith(
        f"{field}: unknown field; normcal's field is `{use}`"
    )
    assert problem["errors"][0]["loc"] == ["body", *field.split(".")]
    assert problem["errors"][0]["type"] == "extra_forbidden"
    assert _state(kb) == before


def test_a_habit_is_hinted_only_where_the_route_has_the_field(kb):
    # documents/query has no `min_probability`: no hint pointing at it.
    problem = assert_problem(kb.post(f"{URL}/documents/query", json={"min_score": 1}))
    assert problem["detail"] == "min_score: Extra inputs are not permitted"
    # A habit with no counterpart says why instead.
    problem = assert_problem(
        kb.post(f"{URL}/search", json={"query": "a", "with_payload": True})
    )
    assert "hits always carry their metadata" in problem["detail"]


def test_every_habit_points_at_a_field_normcal_has():
    from app.schemas import documents, search

    known = {
        name
        for module in (documents, search)
        for model in vars(module).values()
        if isinstance(model, type) and hasattr(model, "model_fields")
        for name in model.model_fields
    }
    for habit, (fields, note) in HABITS.items():
        assert fields or note, habit
        assert set(fields) <= known, habit
