"""Search modes over the real model, FAISS and SQLite FTS5, through HTTP.

``dense`` is the cosine top-k as before; ``lexical`` the BM25 top-k (only documents
holding a query word); ``hybrid`` the candidates of both lists ranked by calibrated
probability. One pool is scored per query, so a document's probability is the same
number in every mode that returns it.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.fakes import HashEmbedder

ROUTER = {
    "r1": "Hold the power button of the wireless router for ten seconds.",
    "r2": "Restarting the wireless router often fixes dropped connections.",
    "r3": "A factory reset of the network gateway erases custom settings.",
    "r4": "Unplug the router, wait thirty seconds, and plug it back in.",
    "r5": "If the Wi-Fi light blinks red, restart the access point.",
    "r6": "Router firmware updates improve stability and security.",
    "r7": "Move the access point away from microwaves to reduce interference.",
}
OTHER = {
    # Shares only the rare code with the query; about something else entirely.
    "bread": "Sourdough needs a lively starter; bake the loaf for forty minutes "
    "at high heat and let it cool on a rack. Oven batch QX7Z.",
    "garden": "Tomatoes grow best in full sun and warm soil.",
    "music": "The violin concerto was performed by the city orchestra.",
    "run": "She was running along the river every morning.",
}
CORPUS = {**ROUTER, **OTHER}
QUERY = "modem keeps disconnecting with status QX7Z"
MAX_K = 12


@pytest.fixture(scope="module")
def kb(tmp_path_factory, embedder):
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("modes") / "data",
        limits=Limits(max_k=MAX_K),
    )
    with TestClient(create_app(settings, embedder=embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        docs = [{"id": k, "text": v} for k, v in CORPUS.items()]
        assert c.put(
            "/v1/collections/kb/documents", json={"documents": docs}
        ).is_success
        yield c


def _search(client, status=200, **body):
    r = client.post("/v1/collections/kb/search", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_dense_is_the_cosine_top_k_and_the_default(kb, embedder):
    default = _search(kb, query=QUERY, k=5)
    dense = _search(kb, query=QUERY, k=5, mode="dense")
    assert default == {**dense, "calibrator": default["calibrator"]}
    assert dense["mode"] == "dense"
    ids = list(CORPUS)
    docs = embedder.embed([CORPUS[i] for i in ids], "document").vectors
    query = embedder.embed([QUERY], "query").vectors[0]
    cosine = docs @ query
    expected = [ids[j] for j in np.argsort(-cosine, kind="stable")[:5]]
    assert [h["id"] for h in dense["hits"]] == expected
    for hit in dense["hits"]:
        assert hit["score"] == pytest.approx(
            float(cosine[ids.index(hit["id"])]), abs=1e-5
        )
    # The pool's depth does not change which documents dense returns, or their order.
    deeper = _search(kb, query=QUERY, k=5, candidates=MAX_K)
    assert [h["id"] for h in deeper["hits"]] == expected


def test_lexical_is_bm25_order_over_documents_with_a_query_word(kb):
    result = _search(kb, query="router access point", k=MAX_K, mode="lexical")
    assert result["mode"] == "lexical"
    ids = [h["id"] for h in result["hits"]]
    words = ("router", "access", "point")
    holding = {i for i, t in CORPUS.items() if any(w in t.lower() for w in words)}
    assert set(ids) == holding
    scores = [h["bm25"] for h in result["hits"]]
    assert all(s > 0 for s in scores) and scores == sorted(scores, reverse=True)
    # "access point" twice beats one word once.
    assert ids[0] in {"r5", "r7"}
    assert _search(kb, query="xylophone quartz", mode="lexical")["hits"] == []


def test_a_rare_shared_term_far_in_cosine_is_found_lexically_not_densely(kb):
    k = 4
    dense = _search(kb, query=QUERY, k=k, candidates=k)
    lexical = _search(kb, query=QUERY, k=k, candidates=k, mode="lexical")
    hybrid = _search(kb, query=QUERY, k=k, candidates=k, mode="hybrid")
    assert "bread" not in [h["id"] for h in dense["hits"]]
    assert [h["id"] for h in lexical["hits"]] == ["bread"]  # the only shared word
    # Hybrid ranks the union of both lists by probability: exactly the best k of it.
    union = {h["id"]: h for h in dense["hits"] + lexical["hits"]}
    best = sorted(union.values(), key=lambda h: (-h["probability"], -h["score"]))
    assert [h["id"] for h in hybrid["hits"]] == [h["id"] for h in best[:k]]
    # Hybrid scores the lexical-only document like any other: it is returned
    # whenever the calibrator rates it above the k-th best dense hit.
    assert union["bread"]["probability"] is not None
    assert union["bread"]["bm25"] > 0 and union["bread"]["score"] < min(
        h["score"] for h in dense["hits"]
    )


@pytest.mark.parametrize("query", [QUERY, "router access point", "running QX7Z"])
def test_a_documents_probability_is_the_same_in_every_mode(kb, query):
    seen: dict[str, set[float]] = {}
    bm25: dict[str, set[float]] = {}
    for mode in ("dense", "lexical", "hybrid"):
        for hit in _search(kb, query=query, k=6, candidates=8, mode=mode)["hits"]:
            assert hit["probability"] is not None
            seen.setdefault(hit["id"], set()).add(hit["probability"])
            bm25.setdefault(hit["id"], set()).add(hit["bm25"])
    assert all(len(p) == 1 for p in seen.values()), seen
    assert all(len(b) == 1 for b in bm25.values()), bm25


def test_candidates_bounds(kb):
    _search(kb, query=QUERY, k=MAX_K, candidates=MAX_K, mode="hybrid")  # at the bound
    _search(kb, query=QUERY, k=3, candidates=3, mode="lexical")  # candidates == k
    body = assert_problem(
        kb.post(
            "/v1/collections/kb/search",
            json={"query": QUERY, "k": 4, "candidates": 3, "mode": "hybrid"},
        )
    )
    assert "candidates" in body["detail"]
    assert_problem(
        kb.post(
            "/v1/collections/kb/search", json={"query": QUERY, "candidates": MAX_K + 1}
        )
    )
    assert_problem(
        kb.post("/v1/collections/kb/search", json={"query": QUERY, "k": MAX_K + 1})
    )
    assert_problem(
        kb.post("/v1/collections/kb/search", json={"query": QUERY, "candidates": 0})
    )
    assert_problem(
        kb.post("/v1/collections/kb/search", json={"query": QUERY, "mode": "sparse"})
    )


def test_default_candidates_respect_a_small_max_k(tmp_path, embedder):
    """max_k below the default pool depth (20) still serves searches without
    ``candidates`` (the default is capped, not rejected)."""
    settings = Settings(data_dir=tmp_path / "data", limits=Limits(max_k=5))
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.post("/v1/collections", json={"name": "kb"})
        c.put(
            "/v1/collections/kb/documents",
            json={"documents": [{"id": k, "text": v} for k, v in ROUTER.items()]},
        )
        for mode in ("dense", "lexical", "hybrid"):
            r = c.post(
                "/v1/collections/kb/search", json={"query": "router", "mode": mode}
            )
            assert r.status_code == 200, r.text
            assert 0 < len(r.json()["hits"]) <= 5


def test_lexical_returns_k_hits_beyond_the_lexical_feature_depth(tmp_path, embedder):
    """The BM25 feature ranks stop at depth 100; lexical mode's list must not."""
    settings = Settings(data_dir=tmp_path / "data", limits=Limits(max_k=120))
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.post("/v1/collections", json={"name": "kb"})
        docs = [{"id": str(i), "text": f"note {i} about apples"} for i in range(110)]
        c.put("/v1/collections/kb/documents", json={"documents": docs})
        r = c.post(
            "/v1/collections/kb/search",
            json={"query": "apples", "k": 110, "mode": "lexical"},
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["hits"]) == 110


def test_hybrid_without_a_calibrator_is_a_clear_422_dense_still_works(
    tmp_path, monkeypatch
):
    # No profile of its own and no model-agnostic file: no calibrator at all.
    monkeypatch.setattr("app.profiles.AGNOSTIC_PROFILE", tmp_path / "missing.json")
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, embedder=HashEmbedder())) as c:
        c.post("/v1/collections", json={"name": "kb"})
        c.put(
            "/v1/collections/kb/documents",
            json={"documents": [{"id": k, "text": v} for k, v in ROUTER.items()]},
        )
        body = assert_problem(
            c.post(
                "/v1/collections/kb/search", json={"query": "router", "mode": "hybrid"}
            )
        )
        assert "hybrid" in body["detail"] and "calibrator" in body["detail"]
        assert body["errors"][0]["loc"] == ["mode"]
        for mode in ("dense", "lexical"):
            r = c.post(
                "/v1/collections/kb/search", json={"query": "router", "mode": mode}
            )
            assert r.status_code == 200, r.text
            assert all(h["probability"] is None for h in r.json()["hits"])


def test_stemmer_porter_vs_none_and_invalid(tmp_path, embedder):
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, embedder=embedder)) as c:
        for name, stemmer in (("stemmed", None), ("plain", "none")):
            body = {"name": name} | ({"stemmer": stemmer} if stemmer else {})
            r = c.post("/v1/collections", json=body)
            assert r.status_code == 201, r.text
            assert r.json()["stemmer"] == (stemmer or "porter")
            c.put(
                f"/v1/collections/{name}/documents",
                json={
                    "documents": [
                        {"id": "run", "text": OTHER["run"]},
                        {"id": "x", "text": OTHER["music"]},
                    ]
                },
            )
        found = {}
        for name in ("stemmed", "plain"):
            r = c.post(
                f"/v1/collections/{name}/search",
                json={"query": "run", "mode": "lexical"},
            )
            found[name] = [h["id"] for h in r.json()["hits"]]
        assert found == {"stemmed": ["run"], "plain": []}
        r = c.post(
            "/v1/collections/plain/search", json={"query": "running", "mode": "lexical"}
        )
        assert [h["id"] for h in r.json()["hits"]] == ["run"]
        assert c.get("/v1/collections/plain").json()["stemmer"] == "none"
        for bad in ("snowball", "", None, 1):
            assert_problem(
                c.post("/v1/collections", json={"name": "bad", "stemmer": bad})
            )
        assert c.get("/v1/collections/bad").status_code == 404


FTS5_SYNTAX = [
    '"',
    '"QX7Z',
    "NEAR(router access)",
    "NEAR(",
    "rout*",
    "*",
    "-router",
    "^router",
    "text:router",
    "documents_fts:router",
    "{text}: router",
    "(router OR (access",
    "router) AND (",
    "AND",
    "OR NOT AND",
    "router NOT access",
    "!!! ??? ...",
    "router\x00access",
    "\x00",
    "\x01\x02\x1f\x7f",
    "e\u0301",
    "\u0301\u0302",
    "\ufffd",
    "router " * 300,
]


@pytest.mark.parametrize("query", FTS5_SYNTAX)
@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_fts5_syntax_in_queries_is_plain_text(kb, query, mode):
    r = kb.post("/v1/collections/kb/search", json={"query": query, "mode": mode})
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        assert r.json()["mode"] == mode
    else:
        assert_problem(r)  # e.g. nothing but whitespace: a clear 4xx


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    query=st.text(min_size=1, max_size=300), mode=st.sampled_from(["lexical", "hybrid"])
)
@example(query='router\x00 NEAR( "x* -y ^z text:w (', mode="hybrid")
def test_any_unicode_query_never_gives_5xx(kb, query, mode):
    r = kb.post("/v1/collections/kb/search", json={"query": query, "mode": mode})
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert_problem(r)
