"""The client and the LangChain vector store on a collection of the client's own vectors.

A live server (the real model, for ``/v1/embed`` only): the "own" vectors are the
model's raw ones, sent under another model's name.
"""

from __future__ import annotations

from typing import Literal

import pytest
from normcal_client import InvalidRequest, NormcalClient

from tests.collections.test_storage_contract import JUDGMENTS
from tests.support.corpus import CORPUS, QUERIES

OWN = {"dimension": 384, "model": "offline-minilm"}


def raw(
    nc: NormcalClient, texts: list[str], side: Literal["query", "document"]
) -> list[list[float]]:
    """Raw vectors (unit vector times norm), as a client's own model gives them."""
    data = nc.embed(texts, side).data
    return [[x * e.norm for x in e.embedding] for e in data]


def test_the_client_creates_upserts_searches_and_fits_with_own_vectors(live):
    with NormcalClient(live.url) as nc:
        info = nc.create_collection("own", embedding=OWN)
        assert (info.embedding, info.model, info.dim) == (
            "client",
            "offline-minilm",
            384,
        )
        vectors = raw(nc, list(CORPUS.values()), "document")
        docs = [
            {"id": key, "text": text, "vector": vector}
            for (key, text), vector in zip(CORPUS.items(), vectors, strict=True)
        ]
        assert nc.upsert_documents("own", docs).upserted == len(CORPUS)
        texts = list(QUERIES.values())
        queries = dict(zip(texts, raw(nc, texts, "query"), strict=True))
        text = QUERIES["paris"]
        hit = nc.search("own", text, vector=queries[text], k=1).hits[0]
        assert hit.id == "paris" and hit.probability is not None
        alone = nc.search("own", vector=queries[text], k=1)
        assert alone.hits[0].id == "paris" and alone.calibrator.status == "none"
        batch = nc.search_batch("own", texts, vectors=list(queries.values()), k=1)
        assert [r.hits[0].id for r in batch] == list(QUERIES)
        with pytest.raises(InvalidRequest):
            nc.search("own", text)  # the server cannot embed for this collection
        fitted = nc.fit_calibrator(
            "own", JUDGMENTS, method="platt", query_vectors=queries
        )
        assert fitted.active and fitted.report["n_queries"] == len(QUERIES)


def test_the_langchain_store_adds_embeddings_and_searches_by_vector(live):
    pytest.importorskip("langchain_core")
    from normcal_client.langchain import NormcalVectorStore

    with NormcalClient(live.url) as nc:
        nc.create_collection("lc-own", embedding=OWN)
        texts = list(CORPUS.values())
        vectors = raw(nc, texts, "document")
        query = raw(nc, [QUERIES["faiss"]], "query")[0]
    store = NormcalVectorStore("lc-own", base_url=live.url)
    ids = store.add_embeddings(
        list(zip(texts, vectors, strict=True)),
        [{"topic": k} for k in CORPUS],
        ids=list(CORPUS),
    )
    assert ids == list(CORPUS)
    docs = store.similarity_search_by_vector(query, k=2)
    assert docs[0].id == "faiss" and docs[0].page_content == CORPUS["faiss"]
    filtered = store.similarity_search_by_vector(
        query, k=2, filter={"topic": "paris"}, query=QUERIES["faiss"]
    )
    assert [d.id for d in filtered] == ["paris"]


@pytest.mark.anyio
async def test_the_async_langchain_store_takes_own_vectors(live):
    pytest.importorskip("langchain_core")
    from normcal_client.langchain import NormcalVectorStore

    with NormcalClient(live.url) as nc:
        nc.create_collection("lc-async", embedding=OWN)
        vectors = raw(nc, [CORPUS["aspirin"], CORPUS["python"]], "document")
        query = raw(nc, [QUERIES["aspirin"]], "query")[0]
    store = NormcalVectorStore("lc-async", base_url=live.url)
    pairs = [(CORPUS["aspirin"], vectors[0]), (CORPUS["python"], vectors[1])]
    await store.aadd_embeddings(pairs, ids=["aspirin", "python"])
    docs = await store.asimilarity_search_by_vector(query, k=1)
    assert [d.id for d in docs] == ["aspirin"]
