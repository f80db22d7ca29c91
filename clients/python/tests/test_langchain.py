"""NormcalRetriever's answers checked on the wire, over a mock transport.

No server and no model: abstaining, probabilities in the metadata and the bounds of
its options. Against a live server: ``tests/client/test_langchain*.py``.
"""

from __future__ import annotations

import json

import httpx
import pytest
from normcal_client import NormcalClient, SearchResult

pytest.importorskip("langchain_core")

from normcal_client.langchain import NormcalRetriever, documents_from_result


def _result(abstain, probabilities, confidence=0.4):
    hits = [
        {
            "id": f"d{i}",
            "score": 0.9 - i / 10,
            "bm25": 0.0,
            "probability": p,
            "norm": 4.0,
            "n_tokens": 7,
            "metadata": {"probability": "doc's own", "lang": "en"},
            "text": f"text {i}",
        }
        for i, p in enumerate(probabilities)
    ]
    return {
        "query": {"norm": 3.5, "n_tokens": 6, "truncated": False},
        "mode": "dense",
        "hits": hits,
        "confidence": confidence,
        "abstain": abstain,
        "calibrator": {
            "status": "fitted",
            "id": "cal-7",
            "method": "nt-list",
            "default": False,
        },
    }


def _mock_retriever(answer, **kwargs):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer)

    client = NormcalClient("http://mock", transport=httpx.MockTransport(handler))
    return NormcalRetriever(collection="kb", client=client, **kwargs), seen


def test_abstain_returns_nothing():
    retriever, seen = _mock_retriever(_result(True, [0.2, 0.1]), min_probability=0.05)
    assert retriever.invoke("anything") == []
    assert json.loads(seen[0].content) == {
        "query": "anything",
        "k": 4,
        "mode": "dense",
        "include_text": True,
        "min_probability": 0.05,
    }


def test_abstain_can_be_ignored():
    retriever, _ = _mock_retriever(_result(True, [0.2]), honour_abstain=False)
    assert [d.id for d in retriever.invoke("q")] == ["d0"]


def test_calibrated_hits_carry_probability_and_win_name_clashes():
    retriever, seen = _mock_retriever(
        _result(False, [0.91, 0.55]), target_precision=0.7, k=2
    )
    docs = retriever.invoke("q")
    assert [d.metadata["probability"] for d in docs] == [0.91, 0.55]
    assert docs[0].metadata["lang"] == "en"  # the document's own metadata stays
    assert docs[0].metadata["confidence"] == 0.4
    assert docs[0].metadata["calibrator"] == "cal-7"
    assert json.loads(seen[0].content)["target_precision"] == 0.7


def test_documents_from_result_empty_hits():
    result = SearchResult.model_validate(_result(False, []))
    assert documents_from_result(result) == []


def test_probability_bounds_are_validated():
    from pydantic import ValidationError

    for field in ("min_probability", "target_precision"):
        for bad in (-0.1, 1.5):
            with pytest.raises(ValidationError):
                NormcalRetriever(collection="kb", **{field: bad})


def test_documents_come_in_the_order_of_the_score_they_report():
    """A dense search lists hits by cosine; their probabilities may not descend."""
    from normcal_client.langchain import NormcalVectorStore

    answer = _result(False, [0.30, 0.80, 0.55])  # cosines 0.9, 0.8, 0.7
    retriever, _ = _mock_retriever(answer, k=3)
    docs = retriever.invoke("q")
    assert [d.id for d in docs] == ["d1", "d2", "d0"]
    assert [d.metadata["probability"] for d in docs] == [0.80, 0.55, 0.30]
    assert [d.metadata["rank"] for d in docs] == [0, 1, 2]  # the order returned

    client = retriever.client
    store = NormcalVectorStore("kb", client=client)
    pairs = store.similarity_search_with_relevance_scores("q", k=3)
    assert [(d.id, p) for d, p in pairs] == [("d1", 0.8), ("d2", 0.55), ("d0", 0.3)]
    cosines = store.similarity_search_with_score("q", k=3)  # cosine: its own order
    assert [d.id for d, _ in cosines] == ["d0", "d1", "d2"]
    assert [s for _, s in cosines] == sorted((s for _, s in cosines), reverse=True)


def test_without_probabilities_the_services_order_is_kept():
    retriever, _ = _mock_retriever(_result(False, [None, None]), k=2)
    assert [d.id for d in retriever.invoke("q")] == ["d0", "d1"]
