"""LangChain's own standard suites (``langchain-tests``) against a live server.

Each test gets a fresh collection on the module's live server.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("langchain_tests")

from langchain_tests.integration_tests import (
    RetrieversIntegrationTests,
    VectorStoreIntegrationTests,
)
from normcal_client import NormcalClient
from normcal_client.langchain import NormcalRetriever, NormcalVectorStore

from tests.support.corpus import CORPUS, QUERIES

# The suites' async tests are bare ``async def``; anyio runs them (sync ones ignore it).
pytestmark = pytest.mark.anyio

_names = itertools.count()


@pytest.fixture
def collection(live):
    name = f"lc{next(_names)}"
    with NormcalClient(live.url) as nc:
        nc.create_collection(name)
        yield name
        nc.delete_collection(name)


class TestNormcalRetriever(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _server(self, live, collection):
        with NormcalClient(live.url) as nc:
            nc.upsert_documents(
                collection, [{"id": k, "text": t} for k, t in CORPUS.items()]
            )
        # honour_abstain off: the suite counts documents, whatever the service thinks.
        self._params = {
            "collection": collection,
            "base_url": live.url,
            "honour_abstain": False,
        }

    @property
    def retriever_constructor(self) -> type[NormcalRetriever]:
        return NormcalRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return self._params

    @property
    def retriever_query_example(self) -> str:
        return QUERIES["paris"]


class TestNormcalVectorStore(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, live, collection) -> NormcalVectorStore:  # type: ignore[override]
        return NormcalVectorStore(collection, base_url=live.url)


def test_retriever_invoke_honours_per_call_k(live, collection):
    """The old retriever ignored ``invoke(query, k=1)`` and returned 4 documents."""
    with NormcalClient(live.url) as nc:
        nc.upsert_documents(
            collection, [{"id": k, "text": t} for k, t in CORPUS.items()]
        )
    retriever = NormcalRetriever(
        collection=collection, base_url=live.url, honour_abstain=False
    )
    assert len(retriever.invoke(QUERIES["paris"])) == 4
    docs = retriever.invoke(QUERIES["paris"], k=1)
    assert [d.id for d in docs] == ["paris"]
    meta = docs[0].metadata
    assert (
        meta["probability"] is not None and 0 < meta["score"] <= 1 and meta["norm"] > 0
    )


def test_vectorstore_relevance_is_the_calibrated_probability(live, collection):
    store = NormcalVectorStore(collection, base_url=live.url)
    store.add_texts(list(CORPUS.values()), ids=list(CORPUS))
    pairs = store.similarity_search_with_relevance_scores(QUERIES["paris"], k=5)
    with NormcalClient(live.url) as nc:
        hits = nc.search(collection, QUERIES["paris"], k=5).hits
    by_probability = sorted(hits, key=lambda h: -(h.probability or 0.0))
    assert [(d.id, p) for d, p in pairs] == [
        (h.id, h.probability) for h in by_probability
    ]
    cut = by_probability[1].probability
    kept = store.similarity_search_with_relevance_scores(
        QUERIES["paris"], k=5, score_threshold=cut
    )
    assert kept and all(p >= cut for _, p in kept)
    assert len(kept) < len(pairs)
    cosine = store.similarity_search_with_score(QUERIES["paris"], k=1)
    assert cosine[0][1] == pytest.approx(hits[0].score)
