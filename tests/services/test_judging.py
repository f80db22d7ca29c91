"""The judging loop over HTTP: opt-in query log, queue, next query, skip."""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.collections.store_files import SCHEMA_VERSION
from app.services import next_query
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES

LIMITS = Limits(
    max_query_log_retention=5, max_judging_queries=3, max_logged_query_chars=60
)


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path / "data", limits=LIMITS)


@pytest.fixture
def kb(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
        r = client.put("/v1/collections/kb/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
        yield client


def _search(client, *queries):
    r = client.post("/v1/collections/kb/search", json={"queries": list(queries)})
    assert r.status_code == 200, r.text


def _log(client):
    r = client.get("/v1/collections/kb/query-log")
    assert r.status_code == 200, r.text
    return r.json()


def _next(client, **params):
    r = client.get("/v1/collections/kb/judging/next", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _feedback(client, query, doc_id, relevance=1):
    judgment = {"query": query, "document_id": doc_id, "relevance": relevance}
    r = client.post("/v1/collections/kb/feedback", json={"judgments": [judgment]})
    assert r.status_code == 201, r.text


def test_query_log_is_off_by_default(kb):
    _search(kb, QUERIES["paris"])
    assert _log(kb) == {"enabled": False, "retention": 1000, "entries": 0}
    body = _next(kb)
    assert body["query"] is None and body["source"] == "none" and body["hits"] == []
    assert body["progress"]["target"] == next_query.FIT_MIN_QUERIES == 5


def test_enabled_log_keeps_the_most_recent_queries_up_to_its_retention(kb):
    r = kb.put("/v1/collections/kb/query-log", json={"enabled": True, "retention": 2})
    assert r.json() == {"enabled": True, "retention": 2, "entries": 0}
    _search(kb, "first query", "second query")
    _search(kb, "second query")
    _search(kb, "third query")
    assert _log(kb)["entries"] == 2
    # Most searched first: "second query" (2 searches), then "third query".
    first = _next(kb)
    assert first["source"] == "log" and first["progress"]["remaining"] == 2
    r = kb.post("/v1/collections/kb/judging/skip", json={"query": "first query"})
    assert_problem(r, 404)  # dropped by the retention
    # Lowering the retention trims at once; turning it off stops recording.
    r = kb.put("/v1/collections/kb/query-log", json={"enabled": False, "retention": 1})
    assert r.json() == {"enabled": False, "retention": 1, "entries": 1}
    _search(kb, "fourth query")
    assert _next(kb)["query"] == "third query"  # the most recent one survived


def test_next_offers_a_logged_query_with_its_top_hits(kb):
    kb.put("/v1/collections/kb/query-log", json={"enabled": True, "retention": 5})
    _search(kb, QUERIES["paris"])
    _search(kb, QUERIES["python"], QUERIES["python"])
    _search(kb, QUERIES["faiss"])
    body = _next(kb)
    assert _log(kb)["entries"] == 3 and body["progress"]["remaining"] == 3
    # Which of them depends on the confidence bins (see app.services.next_query); its hits are
    # its own top hits, with their texts and current probabilities.
    key = next(k for k, q in QUERIES.items() if q == body["query"])
    hit = body["hits"][0]
    assert hit["id"] == key and hit["text"] == CORPUS[key]
    assert 0 <= hit["probability"] <= 1


def test_query_log_retention_limit_at_the_bound_and_past_it(kb):
    ok = {"enabled": True, "retention": LIMITS.max_query_log_retention}
    assert kb.put("/v1/collections/kb/query-log", json=ok).status_code == 200
    past = {"enabled": False, "retention": LIMITS.max_query_log_retention + 1}
    body = assert_problem(kb.put("/v1/collections/kb/query-log", json=past))
    assert "retention" in body["detail"]
    assert _log(kb) == {**ok, "entries": 0}  # nothing changed
    for bad in ({"enabled": "yes"}, {"retention": 0}, {"enabled": True, "x": 1}):
        assert_problem(kb.put("/v1/collections/kb/query-log", json=bad))
    assert _log(kb) == {**ok, "entries": 0}


def test_uploaded_queries_come_first_and_judged_or_skipped_ones_never_again(kb):
    kb.put("/v1/collections/kb/query-log", json={"enabled": True, "retention": 5})
    _search(kb, "a logged query")
    queries = [QUERIES["aspirin"], QUERIES["paris"], QUERIES["aspirin"]]
    r = kb.post("/v1/collections/kb/judging/queries", json={"queries": queries})
    assert r.status_code == 201 and r.json() == {"added": 2}
    first = _next(kb, k=3)
    assert first["source"] == "uploaded" and len(first["hits"]) == 3
    assert first["progress"]["remaining"] == 2
    assert _next(kb, k=3) == first  # deterministic given the stored state
    _feedback(kb, first["query"], first["hits"][0]["id"])
    second = _next(kb)
    assert second["query"] != first["query"] and second["source"] == "uploaded"
    progress = second["progress"]
    assert progress["judged_queries"] == 1 and progress["relevant_queries"] == 1
    assert progress["remaining"] == 1 and progress["can_fit"] is False
    r = kb.post("/v1/collections/kb/judging/skip", json={"query": second["query"]})
    assert r.status_code == 204
    third = _next(kb)
    assert third["query"] == "a logged query" and third["source"] == "log"
    assert third["progress"]["skipped"] == 1


def test_progress_says_when_a_fit_is_possible(kb):
    for key in list(QUERIES)[: next_query.FIT_MIN_QUERIES - 1]:
        _feedback(kb, QUERIES[key], key)
    assert _next(kb)["progress"]["can_fit"] is False
    _feedback(kb, "one more judged query", "paris", relevance=0)
    progress = _next(kb)["progress"]
    assert progress["judged_queries"] == next_query.FIT_MIN_QUERIES
    assert progress["can_fit"] is True


def test_bad_judging_requests_change_nothing(kb):
    url = "/v1/collections/kb/judging"
    assert_problem(kb.post(f"{url}/queries", json={"queries": []}))
    assert_problem(kb.post(f"{url}/queries", json={"queries": ["  "]}))
    too_many = {"queries": [f"q{i}" for i in range(LIMITS.max_judging_queries + 1)]}
    assert_problem(kb.post(f"{url}/queries", json=too_many))
    at_limit = {"queries": [f"q{i}" for i in range(LIMITS.max_judging_queries)]}
    assert kb.post(f"{url}/queries", json=at_limit).json() == {"added": 3}
    assert_problem(kb.post(f"{url}/skip", json={"query": "never seen"}), 404)
    assert_problem(kb.post(f"{url}/skip", json={}))
    assert_problem(kb.get(f"{url}/next", params={"k": 0}))
    assert_problem(kb.get(f"{url}/next", params={"k": 101}))
    body = _next(kb)
    assert body["query"] == "q0" and body["progress"]["remaining"] == 3
    assert body["progress"]["skipped"] == 0
    nope = "/v1/collections/nope"
    for method, path, json in (
        ("GET", f"{nope}/judging/next", None),
        ("GET", f"{nope}/query-log", None),
        ("PUT", f"{nope}/query-log", {"enabled": True, "retention": 2}),
        ("POST", f"{nope}/judging/queries", {"queries": ["x"]}),
        ("POST", f"{nope}/judging/skip", {"query": "x"}),
    ):
        assert_problem(kb.request(method, path, json=json), 404)


def test_next_with_a_query_scores_that_query_whatever_its_state(kb):
    _feedback(kb, QUERIES["paris"], "paris")
    body = _next(kb, query=QUERIES["paris"], k=2)  # judged already: asked for anyway
    assert body["query"] == QUERIES["paris"] and body["hits"][0]["id"] == "paris"
    assert body["source"] == "uploaded" and len(body["hits"]) == 2
    assert body["progress"]["judged_queries"] == 1
    assert _next(kb)["query"] is None  # nothing was queued by asking
    too_long = "x" * (Settings().limits.max_text_chars + 1)
    assert_problem(kb.get("/v1/collections/kb/judging/next", params={"query": " "}))
    body = assert_problem(
        kb.get("/v1/collections/kb/judging/next", params={"query": too_long})
    )
    assert body["errors"][0]["loc"] == ["query"]


def test_undo_deletes_one_judgment_and_a_skip(kb):
    _feedback(kb, QUERIES["paris"], "paris")
    _feedback(kb, QUERIES["paris"], "aspirin", relevance=0)
    url = "/v1/collections/kb/feedback"
    # One (query, document) pair: the page's undo of its last judgment.
    params = {"query": QUERIES["paris"], "document_id": "aspirin"}
    assert kb.delete(url, params=params).json() == {"deleted": 1}
    left = kb.get(url).json()["data"]
    assert [(j["query"], j["document_id"]) for j in left] == [
        (QUERIES["paris"], "paris")
    ]
    body = assert_problem(kb.delete(url, params={"document_id": "paris"}))
    assert body["errors"][0]["loc"] == ["document_id"]
    assert kb.get(url).json()["count"] == 1  # nothing deleted
    # A skip taken back: the query is offered again.
    kb.post("/v1/collections/kb/judging/queries", json={"queries": ["a query"]})
    skip = "/v1/collections/kb/judging/skip"
    assert kb.post(skip, json={"query": "a query"}).status_code == 204
    assert _next(kb)["query"] is None
    assert kb.delete(skip, params={"query": "a query"}).status_code == 204
    body = _next(kb)
    assert body["query"] == "a query" and body["progress"]["skipped"] == 0
    assert_problem(kb.delete(skip, params={"query": "a query"}), 404)  # not skipped
    assert_problem(kb.delete(skip))  # which query?
    assert_problem(kb.delete("/v1/collections/nope/judging/skip?query=x"), 404)


def test_suggestions_are_distinctive_words_of_the_documents(kb):
    r = kb.get("/v1/collections/kb/judging/suggestions", params={"n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["data"]) == 3
    for s in body["data"]:
        words = s["query"].split()
        text = CORPUS[s["document_id"]].lower()
        assert 2 <= len(words) <= 3 and all(w in text for w in words)
    assert len({s["document_id"] for s in body["data"]}) == 3  # spread over documents
    again = kb.get("/v1/collections/kb/judging/suggestions", params={"n": 3}).json()
    assert again == body  # deterministic
    # Queued (or judged) queries are not suggested again.
    first = body["data"][0]["query"]
    kb.post("/v1/collections/kb/judging/queries", json={"queries": [first]})
    later = kb.get("/v1/collections/kb/judging/suggestions", params={"n": 5}).json()
    assert first not in [s["query"] for s in later["data"]]


def test_suggestions_limit_at_the_bound_and_past_it(kb):
    url = "/v1/collections/kb/judging/suggestions"
    assert kb.get(url, params={"n": 20}).json()["count"] == len(
        CORPUS
    )  # at most one each
    body = assert_problem(kb.get(url, params={"n": 21}))
    assert "n: 21 exceeds the limit of 20" in body["detail"]
    assert_problem(kb.get(url, params={"n": 0}))
    assert_problem(kb.get("/v1/collections/nope/judging/suggestions"), 404)
    kb.post("/v1/collections", json={"name": "empty"})
    r = kb.get("/v1/collections/empty/judging/suggestions")
    assert r.json() == {"count": 0, "data": []}


def test_a_collection_file_from_before_the_judging_tables_still_opens(
    settings, embedder
):
    app = create_app(settings, embedder=embedder)
    with TestClient(app) as client:
        client.post("/v1/collections", json={"name": "old"})
    path = settings.data_dir / "old.sqlite3"
    with sqlite3.connect(path) as conn:  # what schema version 1 wrote
        for table in ("query_log", "judging_queries", "judging_skips", "rerank_log"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM meta WHERE key = 'schema_version'")
    conn.close()
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.get("/v1/collections/old").json()["status"] == "ready"
        r = client.post(
            "/v1/collections/old/judging/queries", json={"queries": ["works"]}
        )
        assert r.status_code == 201, r.text
    with sqlite3.connect(path) as conn:
        version = conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),)


def test_a_collection_file_from_before_the_log_flag_keeps_its_log(settings, embedder):
    with TestClient(create_app(settings, embedder=embedder)) as client:
        client.post("/v1/collections", json={"name": "old"})
        on = {"enabled": True, "retention": 5}
        assert client.put("/v1/collections/old/query-log", json=on).status_code == 200
        r = client.post("/v1/collections/old/search", json={"query": "kept"})
        assert r.status_code == 200, r.text
    path = settings.data_dir / "old.sqlite3"
    with sqlite3.connect(path) as conn:  # what schema version 3 wrote
        conn.execute("DROP TABLE rerank_log")
        conn.execute("ALTER TABLE query_log DROP COLUMN truncated")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.get("/v1/collections/old").json()["status"] == "ready"
        offered = client.get("/v1/collections/old/judging/next").json()
        assert (offered["query"], offered["truncated"]) == ("kept", False)
    with sqlite3.connect(path) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(query_log)")]
    conn.close()
    assert columns[-1] == "truncated"


def test_the_log_keeps_a_query_up_to_its_bound_and_flags_one_cut(kb):
    kb.put("/v1/collections/kb/query-log", json={"enabled": True, "retention": 5})
    at = (QUERIES["paris"] + " " * 40)[: LIMITS.max_logged_query_chars]
    past = QUERIES["python"] + "?" * LIMITS.max_logged_query_chars
    _search(kb, at)
    _search(kb, past)
    _search(kb, past[:-1] + "!")  # the same first characters: the same entry
    assert _log(kb)["entries"] == 2
    offered = {}
    for _ in range(2):
        body = _next(kb)
        offered[body["query"]] = body["truncated"]
        r = kb.post("/v1/collections/kb/judging/skip", json={"query": body["query"]})
        assert r.status_code == 204, r.text
    assert offered == {at: False, past[: LIMITS.max_logged_query_chars]: True}


@pytest.mark.parametrize(
    ("confidences", "turn", "expected"),
    [
        ([0.1, 0.5, 0.9], 0, 1),  # middle bin first
        ([0.1, 0.5, 0.9], 1, 0),  # then the low end
        ([0.1, 0.5, 0.9], 2, 2),  # then the high end
        ([0.1, 0.5, 0.9], 3, 1),  # bins 1 and 3 are empty: on to 2
        ([0.95, 0.91, 0.3], 0, 0),  # no middle, no low end: the high end next
        ([0.95, 0.91], 7, 0),  # within a bin, the first in source order
        ([1.0, -0.2], 0, 1),  # out of range clips to the end bins
    ],
)
def test_pick_visits_confidence_bins_in_turn(confidences, turn, expected):
    assert next_query.pick(confidences, turn) == expected
