"""One HTTP contract, three storage backends: every test here runs on ``local`` (SQLite
+ FAISS), on ``milvus`` (Milvus Lite 3.x, a file under ``tmp_path``), on
``milvus-shared`` (the same, ``NORMCAL_MILVUS_LAYOUT=shared``) and on
``milvus-engine`` (the real C++ engine, milvus-lite 2.5.1 over TCP: one server per
session, see tests/support/milvus_engine.py).

Real model, real engines, real HTTP through the app. The Milvus cases skip, with the
reason, when the milvus extra (pymilvus, milvus-lite) is not installed, the engine
cases when the engine's environment is not; ``make test`` and CI install both.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.schemas.filters import Bounds, evaluate, parse
from app.settings import Limits, Settings
from tests.conftest import REPO, assert_problem
from tests.support.corpus import CORPUS, QUERIES

HAS_MILVUS = all(importlib.util.find_spec(m) for m in ("pymilvus", "milvus_lite"))
needs_milvus = pytest.mark.skipif(
    not HAS_MILVUS, reason="the milvus extra (pymilvus, milvus-lite) is not installed"
)
# The Milvus cases are slow (each collection waits on Milvus's index builds): `make
# test` runs them, `make test-fast` the local ones and tests/collections/test_milvus.py's
# smoke set.
MILVUS = [needs_milvus, pytest.mark.slow]
BACKENDS = [
    "local",
    pytest.param("milvus", marks=MILVUS),
    pytest.param("milvus-shared", marks=MILVUS),
    pytest.param("milvus-engine", marks=MILVUS),
]
LIMITS = Limits(
    max_k=8,
    max_page_size=4,
    max_judgments_per_collection=4,
    max_judging_queue=2,
    max_calibrators_per_collection=3,
    max_logged_query_chars=60,
)
# Two topics, so a filter keeps a strict, known subset.
TOPIC = {
    "aspirin": "health",
    "photosynthesis": "science",
    "python": "tech",
    "faiss": "tech",
    "paris": "places",
}
DOCS = [
    {"id": key, "text": text, "metadata": {"topic": TOPIC[key], "n": i}}
    for i, (key, text) in enumerate(CORPUS.items())
]
JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": 1} for doc, q in QUERIES.items()
] + [
    {"query": q, "document_id": other, "relevance": 0}
    for doc, q in QUERIES.items()
    for other in CORPUS
    if other != doc
][:10]
URL = "/v1/collections/kb"


def backend_settings(tmp_path: Path, storage: str, **extra: Any) -> Settings:
    """Settings of one backend; Milvus Lite keeps its file under ``tmp_path``."""
    if storage == "milvus":
        extra.setdefault("milvus_uri", str(tmp_path / "milvus.db"))
    return Settings(data_dir=tmp_path / "data", storage=storage, limits=LIMITS, **extra)


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> str:
    """The backend a test runs on: ``local``, ``milvus``, ``milvus-shared`` or
    ``milvus-engine``."""
    return str(request.param)


@pytest.fixture
def storage(engine: str) -> str:
    """The ``storage`` setting of :func:`engine`."""
    return "local" if engine == "local" else "milvus"


def engine_settings(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, **extra: Any
) -> Settings:
    """:func:`backend_settings` of one of :data:`BACKENDS` (the engine's server is
    the session's, emptied for this test)."""
    if engine == "milvus-engine":
        uri = request.getfixturevalue("engine_uri")
        return backend_settings(tmp_path, "milvus", milvus_uri=uri, **extra)
    if engine == "milvus-shared":
        return backend_settings(tmp_path, "milvus", milvus_layout="shared", **extra)
    return backend_settings(tmp_path, engine, **extra)


@pytest.fixture
def settings(tmp_path: Path, engine: str, request: pytest.FixtureRequest) -> Settings:
    return engine_settings(engine, tmp_path, request)


@pytest.fixture
def client(settings: Settings, embedder: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings, embedder=embedder)) as c:
        yield c


@pytest.fixture
def kb(client: TestClient) -> TestClient:
    """``client`` with collection ``kb`` holding the five documents."""
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
    r = client.put(f"{URL}/documents", json={"documents": DOCS})
    assert r.status_code == 200, r.text
    return client


def ids_of(page: dict[str, Any]) -> list[str]:
    return [d["id"] for d in page["data"]]


def everything(client: TestClient) -> dict[str, Any]:
    """What a failed request must leave unchanged: collections and their documents."""
    names = sorted(c["name"] for c in client.get("/v1/collections").json()["data"])
    state: dict[str, Any] = {"collections": names}
    for name in names:
        found = client.post(
            f"/v1/collections/{name}/documents/get", json={"ids": list(CORPUS)}
        ).json()
        state[name] = sorted(
            (d["id"], d["text"], str(d["metadata"])) for d in found["data"]
        )
    return state


# -- collections ------------------------------------------------------------------------
def test_collections_are_created_listed_described_and_dropped(client: TestClient):
    created = client.post("/v1/collections", json={"name": "kb", "description": "d"})
    assert created.status_code == 201, created.text
    assert created.json()["documents"] == 0
    assert client.post("/v1/collections", json={"name": "other"}).status_code == 201
    listed = client.get("/v1/collections").json()["data"]
    assert [c["name"] for c in listed] == ["kb", "other"]
    info = client.get(URL).json()
    assert (info["name"], info["description"], info["dim"]) == ("kb", "d", 384)
    assert client.delete("/v1/collections/other").status_code == 204
    assert_problem(client.get("/v1/collections/other"), 404)
    assert [c["name"] for c in client.get("/v1/collections").json()["data"]] == ["kb"]


def test_names_are_unique_whatever_their_case(kb: TestClient):
    before = everything(kb)
    assert_problem(kb.post("/v1/collections", json={"name": "KB"}), 409)
    assert_problem(kb.post("/v1/collections", json={"name": "kb"}), 409)
    assert everything(kb) == before


# -- documents --------------------------------------------------------------------------
def test_documents_upsert_get_replace_page_and_delete(kb: TestClient):
    doc = kb.get(f"{URL}/documents/paris").json()
    assert doc["text"] == CORPUS["paris"] and doc["metadata"]["topic"] == "places"
    assert doc["norm"] > 0 and doc["n_tokens"] > 0
    r = kb.put(
        f"{URL}/documents",
        json={"documents": [{"id": "paris", "text": "Paris is in France."}]},
    )
    assert r.json()["upserted"] == 1
    replaced = kb.get(f"{URL}/documents/paris").json()
    assert (replaced["text"], replaced["metadata"]) == ("Paris is in France.", {})
    # keyset pages: every document once, the replaced one last (it has a new seq)
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        page = kb.get(f"{URL}/documents", params=params).json()
        seen += ids_of(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert cursor is None and len(seen) == len(set(seen)) == 5 and seen[-1] == "paris"
    found = kb.post(f"{URL}/documents/get", json={"ids": ["faiss", "nope"]}).json()
    assert (ids_of(found), found["missing"]) == (["faiss"], ["nope"])
    assert kb.delete(f"{URL}/documents/faiss").status_code == 204
    assert_problem(kb.get(f"{URL}/documents/faiss"), 404)
    by_filter = kb.post(f"{URL}/documents/delete", json={"filter": {"topic": "tech"}})
    assert by_filter.json()["deleted"] == 1  # python (faiss is gone)
    either = {"$or": [{"n": {"$gte": 3}}, {"topic": {"$in": ["nothing"]}}]}
    r = kb.post(f"{URL}/documents/delete", json={"filter": either})
    assert r.json()["deleted"] == 1  # photosynthesis, n = 3
    by_ids = kb.post(f"{URL}/documents/delete", json={"ids": ["aspirin", "nope"]})
    assert by_ids.json()["deleted"] == 1
    assert kb.get(URL).json()["documents"] == 1
    left = kb.post(f"{URL}/documents/get", json={"ids": list(CORPUS)}).json()
    assert sorted(ids_of(left)) == ["paris"]


# -- search -----------------------------------------------------------------------------
def brute_force(
    client: TestClient, query: str, k: int, where: dict[str, Any]
) -> list[str]:
    """The top-k ids by exact cosine among the documents ``where`` matches (by the
    filter language's evaluator)."""
    tree = parse(where, Bounds())
    kept = [d for d in DOCS if evaluate(tree, d["metadata"])]
    if not kept:
        return []
    docs = client.post(
        "/v1/embed",
        json={"texts": [d["text"] for d in kept], "input_type": "document"},
    ).json()["data"]
    (q,) = client.post(
        "/v1/embed", json={"texts": [query], "input_type": "query"}
    ).json()["data"]
    vectors = np.array([d["embedding"] for d in docs])
    cosine = vectors @ np.array(q["embedding"])
    order = np.argsort(-cosine, kind="stable")[:k]
    return [kept[i]["id"] for i in order]


FILTERS = [
    {},
    {"topic": "tech"},
    {"n": 2},
    {"topic": "none"},
    {"n": {"$gte": 2, "$lt": 4}},
    {"topic": {"$in": ["health", "places"]}},
    {"topic": {"$nin": ["tech"]}, "n": {"$ne": 4}},
    {"$or": [{"topic": "tech"}, {"n": {"$lte": 0}}]},
    {"$not": {"$and": [{"topic": {"$gt": "p"}}, {"n": {"$exists": True}}]}},
    {"n": {"$exists": False}},
    {"topic": {"$nin": ["te\u0001ch"]}, "n": {"$lt": 3}},  # Milvus cannot write it
]


@pytest.mark.parametrize("where", FILTERS)
def test_dense_search_returns_the_brute_force_top_k(kb: TestClient, where):
    query = QUERIES["faiss"]
    r = kb.post(f"{URL}/search", json={"query": query, "k": 3, "filter": where})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert [h["id"] for h in hits] == brute_force(kb, query, 3, where)
    assert all(h["probability"] is not None for h in hits)  # the shipped default
    assert r.json()["calibrator"]["status"] in {"default", "none"}
    assert all(0 <= h["probability"] <= 1 for h in hits)


def test_documents_are_listed_and_counted_by_filter_as_the_evaluator_says(
    kb: TestClient,
):
    """POST .../documents/query pages the matches in write order; .../count counts."""
    for where in FILTERS:
        tree = parse(where, Bounds())
        expected = [d["id"] for d in DOCS if evaluate(tree, d["metadata"])]
        count = kb.post(f"{URL}/documents/count", json={"filter": where})
        assert count.status_code == 200, (where, count.text)
        assert count.json() == {"count": len(expected)}, where
        seen: list[str] = []
        body: dict[str, Any] = {"filter": where, "limit": 2}
        for _ in range(4):
            page = kb.post(f"{URL}/documents/query", json=body)
            assert page.status_code == 200, (where, page.text)
            assert page.json()["count"] == len(page.json()["data"]) <= 2
            seen += ids_of(page.json())
            if page.json()["next_cursor"] is None:
                break
            body["cursor"] = page.json()["next_cursor"]
        assert seen == expected, where
    whole = kb.post(f"{URL}/documents/query", json={"limit": LIMITS.max_page_size})
    assert whole.status_code == 200 and ids_of(whole.json()) == [
        d["id"] for d in DOCS[:4]
    ]
    before = everything(kb)
    for body in (
        {"limit": LIMITS.max_page_size + 1},
        {"filter": {"n": {"$regex": "x"}}},
        {"filter": {"topic": "tech"}, "cursor": "not-a-cursor"},
        {"where": {"topic": "tech"}},
    ):
        assert_problem(kb.post(f"{URL}/documents/query", json=body))
    problem = assert_problem(
        kb.post(f"{URL}/documents/count", json={"filter": {"$or": {"n": 1}}})
    )
    assert problem["errors"][0]["loc"] == ["filter", "$or"]
    assert_problem(kb.post("/v1/collections/nope/documents/count", json={}), 404)
    assert everything(kb) == before


def test_k_is_accepted_at_its_bound_and_refused_past_it(kb: TestClient):
    query = {"query": QUERIES["paris"]}
    at = kb.post(f"{URL}/search", json={**query, "k": LIMITS.max_k})
    assert at.status_code == 200 and len(at.json()["hits"]) == 5
    assert_problem(kb.post(f"{URL}/search", json={**query, "k": LIMITS.max_k + 1}))
    assert_problem(kb.post(f"{URL}/search", json={**query, "k": 0}))


def test_the_default_profile_gives_probabilities(kb: TestClient):
    body = kb.post(f"{URL}/search", json={"query": QUERIES["aspirin"], "k": 5}).json()
    assert body["calibrator"]["status"] == "default"
    assert body["hits"][0]["id"] == "aspirin"
    assert all(h["probability"] is not None for h in body["hits"])


# -- feedback and calibrators -----------------------------------------------------------
def test_feedback_is_added_listed_and_deleted(kb: TestClient):
    r = kb.post(f"{URL}/feedback", json={"judgments": JUDGMENTS[:3]})
    assert r.status_code == 201 and r.json() == {"stored": 3, "total": 3}
    listed = kb.get(f"{URL}/feedback", params={"limit": 2}).json()
    assert [j["document_id"] for j in listed["data"]] == ["aspirin", "python"]
    rest = kb.get(f"{URL}/feedback", params={"cursor": listed["next_cursor"]}).json()
    assert [j["document_id"] for j in rest["data"]] == ["paris"]
    one = kb.delete(f"{URL}/feedback", params={"query": QUERIES["python"]})
    assert one.json() == {"deleted": 1}
    # One (query, document) pair: the judging page's undo.
    pair = {"query": QUERIES["paris"], "document_id": "aspirin"}
    assert kb.delete(f"{URL}/feedback", params=pair).json() == {"deleted": 0}
    pair["document_id"] = "paris"
    assert kb.delete(f"{URL}/feedback", params=pair).json() == {"deleted": 1}
    assert kb.delete(f"{URL}/feedback").json() == {"deleted": 1}


def test_a_skip_is_taken_back(kb: TestClient):
    kb.post(f"{URL}/judging/queries", json={"queries": ["u1"]})
    assert kb.post(f"{URL}/judging/skip", json={"query": "u1"}).status_code == 204
    offered = f"{URL}/judging/next?k=3"  # within this module's max_k
    assert kb.get(offered).json()["query"] is None
    assert kb.delete(f"{URL}/judging/skip", params={"query": "u1"}).status_code == 204
    assert kb.get(offered).json()["query"] == "u1"
    assert_problem(kb.delete(f"{URL}/judging/skip", params={"query": "u1"}), 404)


def test_suggestions_are_drawn_from_the_stored_documents(kb: TestClient):
    """The judging page's start, read from either backend's documents."""
    body = kb.get(f"{URL}/judging/suggestions", params={"n": 3}).json()
    assert body["count"] == 3
    for s in body["data"]:
        words = set(re.findall(r"\w+", CORPUS[s["document_id"]].lower()))
        assert set(s["query"].split()) <= words
    kb.post(f"{URL}/judging/queries", json={"queries": [body["data"][0]["query"]]})
    again = kb.get(f"{URL}/judging/suggestions", params={"n": 3}).json()["data"]
    assert body["data"][0] not in again and body["data"][1] in again


def test_stored_feedback_and_the_judging_queue_are_capped(kb: TestClient):
    """The caps live in the service layer, so both backends keep them."""
    stored = kb.post(f"{URL}/feedback", json={"judgments": JUDGMENTS[:4]})
    assert stored.status_code == 201 and stored.json()["total"] == 4  # the bound
    past = kb.post(f"{URL}/feedback", json={"judgments": JUDGMENTS[4:5]})
    assert "limits.max_judgments_per_collection" in assert_problem(past)["detail"]
    assert len(kb.get(f"{URL}/feedback").json()["data"]) == 4
    queued = kb.post(f"{URL}/judging/queries", json={"queries": ["u1", "u2"]})
    assert queued.status_code == 201 and queued.json()["added"] == 2  # the bound
    past = kb.post(f"{URL}/judging/queries", json={"queries": ["u3"]})
    assert "limits.max_judging_queue" in assert_problem(past)["detail"]
    waiting = kb.get(f"{URL}/judging/next", params={"k": 3}).json()["progress"]
    assert waiting["remaining"] == 2
    # A fit that skips unknown documents says how many it dropped.
    unknown = [{"query": QUERIES["paris"], "document_id": "gone", "relevance": 1}]
    body = {"judgments": JUDGMENTS[4:] + unknown, "method": "platt", "k": 5}
    assert_problem(kb.post(f"{URL}/calibrators", json=body))  # "gone" is unknown
    r = kb.post(f"{URL}/calibrators", json={**body, "unknown_documents": "skip"})
    assert r.status_code == 201, r.text
    assert r.json()["dropped_judgments"] == 1
    inputs = r.json()["judgments"]  # and what it ran on: sent, stored, dropped
    assert (inputs["sent"], inputs["feedback"], inputs["dropped"]) == (12, 4, 1)
    assert inputs["queries"] == len(QUERIES)


def test_a_logged_rerank_request_is_judged_and_trimmed(kb: TestClient):
    """The rerank log is part of the collection's state on every backend."""
    kb.put(f"{URL}/query-log", json={"enabled": True, "retention": 1})
    documents = [{"text": CORPUS[n], "id": f"ext-{n}"} for n in ("python", "paris")]
    for query in (QUERIES["python"], QUERIES["paris"]):
        body = {"query": query, "documents": documents, "collection": "kb"}
        assert kb.post("/v1/rerank", json=body).status_code == 200
    nxt = kb.get(f"{URL}/judging/next", params={"k": 2}).json()
    assert nxt["rerank"] and nxt["query"] == QUERIES["paris"]  # retention 1
    assert nxt["hits"][0]["id"] == "ext-paris"
    judged = [{"query": nxt["query"], "document_id": "ext-paris", "relevance": 1}]
    assert kb.post(f"{URL}/feedback", json={"judgments": judged}).status_code == 201
    trimmed = [
        {"query": QUERIES["python"], "document_id": "ext-python", "relevance": 1}
    ]
    assert_problem(kb.post(f"{URL}/feedback", json={"judgments": trimmed}))


def fit(client: TestClient, *, activate: bool = True) -> str:
    r = client.post(
        f"{URL}/calibrators",
        json={"judgments": JUDGMENTS, "method": "platt", "k": 5, "activate": activate},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_calibrator_is_fitted_activated_listed_and_deleted(kb: TestClient):
    first = fit(kb)
    second = fit(kb, activate=False)
    listed = {c["id"]: c for c in kb.get(f"{URL}/calibrators").json()["data"]}
    assert listed[first]["active"] and not listed[second]["active"]
    search = kb.post(f"{URL}/search", json={"query": QUERIES["paris"], "k": 2}).json()
    assert search["calibrator"]["id"] == first
    assert kb.post(f"{URL}/calibrators/{second}/activate").status_code == 200
    assert_problem(kb.delete(f"{URL}/calibrators/{second}"), 409)  # the active one
    assert kb.delete(f"{URL}/calibrators/{first}").status_code == 204
    assert_problem(kb.delete(f"{URL}/calibrators/{first}"), 404)
    search = kb.post(f"{URL}/search", json={"query": QUERIES["paris"], "k": 2}).json()
    assert search["calibrator"]["id"] == second


def test_calibrators_are_listed_a_page_at_a_time_and_capped(kb: TestClient):
    fitted = fit(kb, activate=False)
    profile = kb.get(f"{URL}/calibrators/{fitted}/export").json()

    def imported() -> Any:
        return kb.post(f"{URL}/calibrators/import", json={"profile": profile})

    copies = [imported().json()["id"] for _ in range(2)]  # 3 stored: the bound
    problem = assert_problem(imported(), 422)
    assert "calibrators: 4 exceeds the limit of 3" in problem["detail"]
    listed, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = kb.get(f"{URL}/calibrators", params=params).json()
        listed += page["data"]
        if (cursor := page["next_cursor"]) is None:
            break
    assert [c["id"] for c in listed[1:]] == [fitted, *copies]  # after the default
    assert listed[0]["default"] and "report" not in listed[1]
    assert kb.delete(f"{URL}/calibrators/{copies[0]}").status_code == 204
    assert imported().status_code == 201  # room again


def test_the_query_log_keeps_the_first_characters_and_says_so(kb: TestClient):
    assert kb.put(f"{URL}/query-log", json={"enabled": True}).status_code == 200
    long = QUERIES["paris"] + " and more" * 20
    assert kb.post(f"{URL}/search", json={"query": long}).status_code == 200
    offered = kb.get(f"{URL}/judging/next", params={"k": 3}).json()
    assert offered["source"] == "log" and offered["truncated"] is True
    assert offered["query"] == long[: LIMITS.max_logged_query_chars]


# -- errors change nothing --------------------------------------------------------------
def _deep(levels: int) -> dict[str, Any]:
    raw: dict[str, Any] = {"topic": "tech"}
    for _ in range(levels - 1):
        raw = {"$not": raw}
    return raw


BAD_FILTERS = [
    ({"topic": {"$regex": "t.*"}}, ["filter", "topic", "$regex"]),
    (
        {"$or": [{"topic": "tech"}, {"n": {"$gt": True}}]},
        ["filter", "$or[1]", "n", "$gt"],
    ),
    ({"n": {"$in": 3}}, ["filter", "n", "$in"]),
    ({"$nor": [{"topic": "tech"}]}, ["filter", "$nor"]),
    (_deep(Limits().max_filter_depth + 1), ["filter", *["$not"] * 8]),
    (
        {"topic": {"$in": ["tech"] * (Limits().max_filter_values + 1)}},
        ["filter", "topic", "$in"],
    ),
]


def test_errors_are_problems_and_change_nothing(kb: TestClient):
    before = everything(kb)
    q = {"query": QUERIES["paris"], "k": 2}
    assert_problem(kb.post("/v1/collections/nope/search", json=q), 404)
    assert_problem(kb.get("/v1/collections/nope/documents/paris"), 404)
    assert_problem(kb.get(f"{URL}/documents/nope"), 404)
    assert_problem(kb.delete(f"{URL}/documents/nope"), 404)
    assert_problem(kb.post(f"{URL}/search", json={**q, "filter": {"topic": [1]}}))
    for bad, loc in BAD_FILTERS:
        body = assert_problem(kb.post(f"{URL}/documents/delete", json={"filter": bad}))
        assert body["errors"][0]["loc"] == loc, bad
        assert_problem(kb.post(f"{URL}/search", json={**q, "filter": bad}))
    assert_problem(kb.post("/v1/collections", json={"name": "kb"}), 409)
    assert_problem(kb.post(f"{URL}/calibrators/nope/activate"), 404)
    assert everything(kb) == before


@pytest.mark.parametrize("engine", [p for p in BACKENDS if p != "local"], indirect=True)
def test_an_engine_without_bm25_is_refused_at_create_naming_it_and_its_version(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
):
    """The refusal is the server's (faked: every engine here has BM25), as Milvus
    2.4 answers a BM25 function; a 422, not a retried 503, and nothing is left."""
    from pymilvus import MilvusClient, MilvusException

    create = MilvusClient.create_collection

    def refuse(self: MilvusClient, name: str, **kwargs: Any) -> None:
        if kwargs.get("schema") is not None and kwargs["schema"].functions:
            raise MilvusException(1100, "function type BM25 is not supported")
        create(self, name, **kwargs)

    monkeypatch.setattr(MilvusClient, "create_collection", refuse)
    body = assert_problem(client.post("/v1/collections", json={"name": "kb"}), 422)
    assert body["type"].endswith("backend-unsupported")
    assert "BM25 full-text search" in body["detail"]
    assert "version milvus_lite-3." in body["detail"] or "Lite 2.x" in body["detail"]
    assert client.get("/v1/collections").json()["data"] == []
    monkeypatch.undo()
    assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201


# -- restart ----------------------------------------------------------------------------
def test_a_restart_serves_identical_results(kb: TestClient, settings, embedder):
    calibrator = fit(kb)
    queries = {"queries": list(QUERIES.values()), "k": 4}
    before = kb.post(f"{URL}/search", json=queries).json()
    kb.__exit__(None, None, None)  # the lifespan closes the storage
    with TestClient(create_app(settings, embedder=embedder)) as again:
        after = again.post(f"{URL}/search", json=queries).json()
    assert after == before
    results = after["results"]
    assert all(r["calibrator"]["id"] == calibrator for r in results)
    assert all(h["probability"] is not None for r in results for h in r["hits"])


class OtherFiles:
    """The same model name served from other files: another identity."""

    model_id = "other-files"

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_collection_of_other_model_files_is_refused_not_lost(
    kb: TestClient, settings, embedder
):
    kb.__exit__(None, None, None)
    with TestClient(create_app(settings, embedder=OtherFiles(embedder))) as other:
        q = {"query": QUERIES["paris"], "k": 2}
        body = assert_problem(other.post(f"{URL}/search", json=q), 409)
        assert "identity" in body["detail"]
        assert other.get(URL).json()["documents"] == 5  # described, not used
        assert other.delete(URL).status_code == 204


# -- what only the local backend has ----------------------------------------------------
def test_snapshots_are_local_only(kb: TestClient, storage: str):
    r = kb.post(f"{URL}/snapshots")
    if storage == "local":
        assert r.status_code == 201, r.text
        return
    body = assert_problem(r, 422)
    assert body["type"].endswith("backend-unsupported") and "milvus" in body["detail"]
    assert_problem(kb.get(f"{URL}/snapshots"), 422)
    assert_problem(kb.post("/v1/collections/nope/snapshots"), 404)
    # Neither a restore into a new collection nor an upload: refused before a byte
    # of the file is read, and nothing is made.
    before = everything(kb)
    snapshot = f"{URL}/snapshots/20250101T000000000Z-0123abcd/restore"
    body = assert_problem(kb.post(snapshot, json={"into": "copy"}), 422)
    assert body["type"].endswith("backend-unsupported")
    for name in ("kb", "moved"):
        upload = kb.post(f"/v1/collections/{name}/snapshots/upload", content=b"x")
        assert assert_problem(upload, 422)["type"].endswith("backend-unsupported")
    assert everything(kb) == before


def test_a_healthy_backend_is_ready(client: TestClient):
    body = client.get("/readyz").json()
    assert body["status"] == "ready", body


# -- Milvus only ------------------------------------------------------------------------
@needs_milvus
def test_an_unreachable_milvus_is_reported_by_readiness(tmp_path, embedder):
    settings = backend_settings(tmp_path, "milvus", milvus_uri="http://127.0.0.1:9")
    with TestClient(create_app(settings, embedder=embedder)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert any("127.0.0.1:9" in r for r in ready.json()["reasons"])
        assert_problem(client.post("/v1/collections", json={"name": "kb"}), 503)


@contextmanager
def milvus_server(kind: str, tmp_path: Path, request: pytest.FixtureRequest):
    """A Milvus server several clients share: Milvus Lite 3.x's, or the engine."""
    if kind == "milvus-engine":
        yield request.getfixturevalue("engine_uri")
        return
    from tests.support.milvus_lite import milvus_lite_server

    with milvus_lite_server(tmp_path / "server") as uri:
        yield uri


@needs_milvus
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["milvus", "milvus-engine"])
def test_replicas_on_one_milvus_see_each_others_writes_and_calibrator(
    tmp_path, embedder, kind, request
):
    with milvus_server(kind, tmp_path, request) as uri:
        settings = backend_settings(tmp_path, "milvus", milvus_uri=uri)
        with (
            TestClient(create_app(settings, embedder=embedder)) as one,
            TestClient(create_app(settings, embedder=embedder)) as two,
        ):
            assert one.post("/v1/collections", json={"name": "kb"}).status_code == 201
            assert_problem(two.post("/v1/collections", json={"name": "Kb"}), 409)
            one.put(f"{URL}/documents", json={"documents": DOCS[:3]})
            two.put(f"{URL}/documents", json={"documents": DOCS[3:]})
            assert one.get(URL).json()["documents"] == 5
            assert two.get(f"{URL}/documents/{DOCS[0]['id']}").status_code == 200
            calibrator = fit(two)
            q = {"query": QUERIES["paris"], "k": 3}
            seen_by_one = one.post(f"{URL}/search", json=q).json()
            seen_by_two = two.post(f"{URL}/search", json=q).json()
            assert seen_by_one["calibrator"]["id"] == calibrator
            # The same answer; floats up to rounding: the replica that fitted holds
            # the query's vector from the fit's batch in its embedding cache.
            assert close(seen_by_one, seen_by_two)
            assert_problem(one.delete(f"{URL}/calibrators/{calibrator}"), 409)
            # back to the shipped default on one replica: the other follows
            listed = two.get(f"{URL}/calibrators").json()["data"]
            (default,) = [c["id"] for c in listed if c["default"]]
            assert one.post(f"{URL}/calibrators/{default}/activate").is_success
            after = two.post(f"{URL}/search", json=q).json()["calibrator"]
            assert after["status"] == "default"
            assert two.delete(f"{URL}/calibrators/{calibrator}").status_code == 204
            assert two.delete("/v1/collections/kb").status_code == 204
            assert_problem(one.post(f"{URL}/search", json=q), 404)
            assert one.get("/v1/collections").json()["data"] == []


def close(a: Any, b: Any, rel: float = 1e-5) -> bool:
    """The same JSON value, floats equal up to ``rel``."""
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=rel, abs=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            close(x, y, rel) for x, y in zip(a, b, strict=True)
        )
    return bool(a == b)


def hybrid_hits(settings: Settings, embedder: Any) -> dict[str, list[dict[str, Any]]]:
    """The hybrid hits of every corpus query on a new ``kb`` of ``settings``."""
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.post("/v1/collections", json={"name": "kb"}).status_code == 201
        client.put(f"{URL}/documents", json={"documents": DOCS})
        return {
            doc: client.post(
                f"{URL}/search", json={"query": q, "k": 5, "mode": "hybrid"}
            ).json()["hits"]
            for doc, q in QUERIES.items()
        }


@needs_milvus
@pytest.mark.slow
def test_lexical_evidence_agrees_between_milvus_lite_and_the_engine(
    tmp_path, embedder, engine_uri
):
    """Same hits, BM25 within 2% and probabilities within 0.005 (measured: 0.8% and
    0.0007; the two engines' BM25 statistics differ slightly). The local backend's
    BM25 is FTS5's, on another scale (docs/storage.md): not compared."""
    lite = hybrid_hits(backend_settings(tmp_path, "milvus"), embedder)
    real = hybrid_hits(
        backend_settings(tmp_path / "engine", "milvus", milvus_uri=engine_uri), embedder
    )
    for doc, hits in lite.items():
        assert [h["id"] for h in real[doc]] == [h["id"] for h in hits]
        assert [h["bm25"] for h in real[doc]] == pytest.approx(
            [h["bm25"] for h in hits], rel=0.02
        )
        assert [h["probability"] for h in real[doc]] == pytest.approx(
            [h["probability"] for h in hits], abs=0.005
        )


@pytest.mark.slow  # starts a Python process
def test_the_app_runs_locally_without_pymilvus_and_names_the_extra_for_milvus(
    tmp_path,
):
    """pymilvus blocked at import: local storage works, milvus refuses to start."""
    script = f"""
import sys
sys.modules["pymilvus"] = None  # what an install without the extra looks like
from app.api.app import create_app
from app.collections.backends import BackendMissingError, open_registry
from app.settings import Settings

local = Settings(data_dir={str(tmp_path / "data")!r})
registry = open_registry(local, model_name="m", model_id=None, dim=4,
                         load_calibrator=dict)
registry.create("kb")
assert registry.names() == ["kb"]
registry.close()
try:
    open_registry(Settings(storage="milvus"), model_name="m", model_id=None,
                  dim=4, load_calibrator=dict)
except BackendMissingError as error:
    print(error)
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "normcal[milvus]" in out.stdout and "EXTRAS=milvus" in out.stdout
