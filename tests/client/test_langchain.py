"""NormcalRetriever against the real service (its wire-level answers are checked over a
mock transport in clients/python/tests).

LangChain's standard suites are in ``test_langchain_standard.py``; these are the
behaviours that are normcal's own: probabilities in the metadata, abstaining,
service-side filters, and clients given by the caller.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from normcal_client import AsyncNormcalClient, NormcalClient

from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import source_env

pytest.importorskip("langchain_core")

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from normcal_client.langchain import (
    NormcalRetriever,
    NormcalVectorStore,
    documents_from_result,
)

DOCS = [
    {"id": key, "text": text, "metadata": {"topic": key, "source": f"{key}.txt"}}
    for key, text in CORPUS.items()
]


@pytest.mark.slow  # starts a Python process
def test_service_cli_and_client_do_not_import_langchain():
    """LangChain is the client's optional extra: nothing else may need it."""
    code = (
        "import sys, app.api.app, app.cli.main, normcal_client; "
        "assert 'langchain_core' not in sys.modules, 'langchain imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, env=source_env()
    )


@pytest.fixture(scope="module")
def kb(live):
    with NormcalClient(live.url) as nc:
        nc.create_collection("kb", exist_ok=True)
        nc.upsert_documents("kb", DOCS)
    return live


def test_retriever_returns_documents_with_normcal_metadata(kb):
    retriever = NormcalRetriever(collection="kb", base_url=kb.url, k=3)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(QUERIES["paris"])
    assert len(docs) == 3 and all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert top.id == "paris" and top.page_content == CORPUS["paris"]
    meta = top.metadata
    assert meta["id"] == "paris" and meta["source"] == "paris.txt"
    assert [d.metadata["rank"] for d in docs] == [0, 1, 2]
    assert 0 < meta["score"] <= 1 and meta["norm"] > 0 and meta["n_tokens"] > 3
    assert meta["probability"] is not None  # the shipped default profile applies
    assert "confidence" in meta and "calibrator" in meta
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True)


def test_retriever_matches_the_service_answer(kb):
    """Whatever the service decides (probabilities, filters, abstain), the
    retriever returns exactly that, as Documents."""
    with NormcalClient(kb.url) as nc:
        for options in (
            {"min_probability": 0.5},
            {"target_precision": 0.8},
            {"min_probability": 0.0, "target_precision": 0.0},
        ):
            retriever = NormcalRetriever(collection="kb", client=nc, k=5, **options)
            for query in (QUERIES["aspirin"], "zxqv blorp"):
                docs = retriever.invoke(query)
                result = nc.search("kb", query, k=5, include_text=True, **options)
                assert docs == documents_from_result(result)
                if result.abstain:
                    assert docs == []
                floor = options.get("min_probability")
                for doc in docs:
                    p = doc.metadata["probability"]
                    assert floor is None or p is None or p >= floor


def test_retriever_filter_passes_through(kb):
    # An off-topic query under a filter: the service abstains, so look past that.
    retriever = NormcalRetriever(
        collection="kb",
        base_url=kb.url,
        k=5,
        filter={"topic": "faiss"},
        honour_abstain=False,
    )
    assert [d.id for d in retriever.invoke(QUERIES["paris"])] == ["faiss"]


def test_retriever_and_vector_store_take_a_search_mode(kb):
    """dense is the default; lexical hits contain a query word; a per-call mode wins."""
    query = "capital chemical"  # two words two documents share with nothing else
    dense = NormcalRetriever(collection="kb", base_url=kb.url, k=5)
    lexical = NormcalRetriever(collection="kb", base_url=kb.url, k=5, mode="lexical")
    with NormcalClient(kb.url) as nc:
        expected = nc.search("kb", query, k=5, mode="lexical", include_text=True)
        assert dense.invoke(query) == documents_from_result(
            nc.search("kb", query, k=5, include_text=True)
        )
    assert [h.id for h in expected.hits] in (
        ["paris", "photosynthesis"],
        ["photosynthesis", "paris"],
    )
    assert lexical.invoke(query) == documents_from_result(expected)
    # the retriever's documents come by the probability they carry
    assert [d.id for d in dense.invoke(query, mode="lexical")] == [
        d.id for d in documents_from_result(expected)
    ]
    # Both words' documents are in the hybrid pool, whether or not the service
    # abstains on this two-word query (the day-one rule may).
    every = NormcalRetriever(
        collection="kb", base_url=kb.url, k=5, mode="lexical", honour_abstain=False
    )
    hybrid = every.invoke(query, mode="hybrid", candidates=5)
    assert {"paris", "photosynthesis"} <= {d.id for d in hybrid}
    store = NormcalVectorStore("kb", base_url=kb.url, mode="lexical")
    assert [d.id for d in store.similarity_search(query, k=5)] == [
        h.id for h in expected.hits
    ]
    assert len(store.similarity_search(query, k=5, mode="dense")) == 5
    assert len(NormcalVectorStore("kb", base_url=kb.url).similarity_search(query)) == 4


@pytest.mark.anyio
async def test_async_retriever_through_asgi(app):
    from asgi_lifespan import LifespanManager

    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with AsyncNormcalClient("http://normcal", transport=transport) as anc:
            await anc.create_collection("akb")
            await anc.upsert_documents("akb", DOCS)
            retriever = NormcalRetriever(collection="akb", async_client=anc, k=2)
            docs = await retriever.ainvoke(QUERIES["aspirin"])
    assert len(docs) == 2 and docs[0].id == "aspirin"
    assert docs[0].page_content == CORPUS["aspirin"]
    assert docs[0].metadata["topic"] == "aspirin" and docs[0].metadata["norm"] > 0


@pytest.mark.anyio
async def test_async_retriever_with_its_own_client(kb):
    retriever = NormcalRetriever(
        collection="kb", base_url=kb.url, k=1, honour_abstain=False
    )
    docs = await retriever.ainvoke(QUERIES["photosynthesis"])
    assert [d.id for d in docs] == ["photosynthesis"]


def test_documents_come_in_the_order_of_the_probability_they_carry(kb):
    """Dense hits come by cosine from the service; LangChain gets them by P."""
    retriever = NormcalRetriever(collection="kb", base_url=kb.url, k=5)
    store = NormcalVectorStore("kb", base_url=kb.url)
    with NormcalClient(kb.url) as nc:
        for query in QUERIES.values():
            served = nc.search("kb", query, k=5)
            docs = retriever.invoke(query)
            probabilities = [d.metadata["probability"] for d in docs]
            assert probabilities == sorted(probabilities, reverse=True)
            assert {d.id for d in docs} == {h.id for h in served.hits}
            pairs = store.similarity_search_with_relevance_scores(query, k=5)
            assert [p for _, p in pairs] == sorted(probabilities, reverse=True)
            cosines = [s for _, s in store.similarity_search_with_score(query, k=5)]
            assert cosines == sorted(cosines, reverse=True)
