"""The rerankers against a live server, behind retrievers that are not normcal.

A team keeps its retriever; normcal calibrates what it returns. Here that retriever
is BM25 over the same five documents the other client tests use (LangChain's
``BM25Retriever``, LlamaIndex's ``BM25Retriever``): an order normcal did not make,
weak on these paraphrased queries, which the rerankers fix and annotate. Cohere's
own client is pointed at normcal's ``/v1/rerank`` and works unchanged. The wire
details of each reranker are checked without a server in
``clients/python/tests/test_rerank.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from normcal_client import AsyncNormcalClient, NormcalClient

from tests.support.corpus import CORPUS, QUERIES

KEYS = list(CORPUS)
TEXTS = [CORPUS[k] for k in KEYS]


def _rerank(live, query: str, texts: list[str]):
    with NormcalClient(live.url) as nc:
        return nc.rerank(query, texts)


def _check_annotations(documents_metadata: list[dict], response) -> None:
    """The metadata the rerankers write is the service's answer, result by result."""
    by_index = {r.index: r for r in response.results}
    for metadata in documents_metadata:
        result = by_index[metadata["input_rank"]]
        assert metadata["probability"] == result.probability
        assert metadata["relevance_score"] == result.relevance_score
        assert metadata["cosine"] == result.score
        lo, hi = metadata["probability_interval"]
        assert 0.0 <= lo <= metadata["probability"] <= hi <= 1.0
        # The confidence is over the results returned (top_n may cut them).
        assert 0.0 <= metadata["confidence"] <= 1.0
        assert metadata["calibrator"] == response.calibrator.id


# -- LangChain ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bm25_langchain():
    pytest.importorskip("langchain_community")
    pytest.importorskip("rank_bm25")
    from langchain_community.retrievers import BM25Retriever

    metadatas = [{"topic": key} for key in KEYS]
    return BM25Retriever.from_texts(TEXTS, metadatas=metadatas, k=len(TEXTS))


def _compression(live, bm25, **options):
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from normcal_client.langchain import NormcalReranker

    reranker = NormcalReranker(base_url=live.url, **options)
    return ContextualCompressionRetriever(base_compressor=reranker, base_retriever=bm25)


def test_langchain_reranker_puts_the_relevant_document_first_behind_bm25(
    live, bm25_langchain
):
    pipeline = _compression(live, bm25_langchain, top_n=1, honour_abstain=False)
    bm25_first = []
    for key, query in QUERIES.items():
        retrieved = bm25_langchain.invoke(query)
        bm25_first.append(retrieved[0].metadata["topic"] == key)
        (best,) = pipeline.invoke(query)
        assert best.metadata["topic"] == key, query
        response = _rerank(live, query, [d.page_content for d in retrieved])
        _check_annotations([best.metadata], response)
        assert best.metadata["input_rank"] == response.results[0].index
    assert len(bm25_first) == len(QUERIES)  # BM25's own first, for the record


def test_langchain_reranker_drops_below_min_probability_and_keeps_metadata(
    live, bm25_langchain
):
    query = QUERIES["paris"]
    retrieved = bm25_langchain.invoke(query)
    response = _rerank(live, query, [d.page_content for d in retrieved])
    probabilities = sorted(r.probability for r in response.results)
    threshold = (probabilities[-1] + probabilities[-2]) / 2  # keeps the best only
    pipeline = _compression(
        live, bm25_langchain, min_probability=threshold, honour_abstain=False
    )
    kept = pipeline.invoke(query)
    assert [d.metadata["topic"] for d in kept] == ["paris"]
    _check_annotations([d.metadata for d in kept], response)
    # Without a threshold every document comes back, most probable first.
    everything = _compression(live, bm25_langchain, honour_abstain=False).invoke(query)
    assert [d.metadata["probability"] for d in everything] == probabilities[::-1]
    assert {d.metadata["topic"] for d in everything} == set(KEYS)


def test_langchain_reranker_async_matches_sync(live, bm25_langchain):
    from normcal_client.langchain import NormcalReranker

    query = QUERIES["aspirin"]
    documents = bm25_langchain.invoke(query)
    reranker = NormcalReranker(base_url=live.url, top_n=3, honour_abstain=False)
    sync = reranker.compress_documents(documents, query)
    asynced = asyncio.run(reranker.acompress_documents(documents, query))
    assert [d.metadata for d in asynced] == [d.metadata for d in sync]
    assert len(sync) == 3 and sync[0].metadata["topic"] == "aspirin"


def test_langchain_reranker_honours_abstain_as_the_service_decides(
    live, bm25_langchain
):
    """The default honours the service's abstain flag: its documents are the
    service's answer, or none exactly when it abstains."""
    from normcal_client.langchain import NormcalReranker

    reranker = NormcalReranker(base_url=live.url)
    for query in [*QUERIES.values(), "quarterly tax filing deadline for freelancers"]:
        documents = bm25_langchain.invoke(query)
        response = _rerank(live, query, [d.page_content for d in documents])
        kept = reranker.compress_documents(documents, query)
        assert len(kept) == (0 if response.abstain else len(documents)), query


# -- LlamaIndex ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def bm25_llama_index():
    pytest.importorskip("llama_index.retrievers.bm25")
    from llama_index.core.schema import TextNode
    from llama_index.retrievers.bm25 import BM25Retriever

    nodes = [TextNode(id_=key, text=CORPUS[key]) for key in KEYS]
    return BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=len(nodes))


def test_llama_index_rerank_puts_the_relevant_node_first_behind_bm25(
    live, bm25_llama_index
):
    from normcal_client.llama_index import NormcalRerank

    rerank = NormcalRerank(base_url=live.url, top_n=2, honour_abstain=False)
    for key, query in QUERIES.items():
        retrieved = bm25_llama_index.retrieve(query)
        best, second = rerank.postprocess_nodes(retrieved, query_str=query)
        assert best.node.node_id == key, query
        assert best.score == best.node.metadata["probability"] > second.score
        # The same request: the texts and the retriever's scores (the default for
        # external lists reads their gaps).
        sent = [{"text": n.node.get_content(), "score": n.score} for n in retrieved]
        response = _rerank(live, query, sent)
        _check_annotations([best.node.metadata, second.node.metadata], response)
        # The retriever's own scores travelled with the nodes and are kept there.
        assert retrieved[best.node.metadata["input_rank"]].node.node_id == key


def test_llama_index_rerank_in_a_query_engine_and_async(live, bm25_llama_index):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from normcal_client.llama_index import NormcalRerank

    rerank = NormcalRerank(base_url=live.url, top_n=1, honour_abstain=False)
    engine = RetrieverQueryEngine.from_args(
        bm25_llama_index, llm=MockLLM(), node_postprocessors=[rerank]
    )
    answer = engine.query(QUERIES["photosynthesis"])
    assert [n.node.node_id for n in answer.source_nodes] == ["photosynthesis"]
    retrieved = bm25_llama_index.retrieve(QUERIES["faiss"])
    sync = rerank.postprocess_nodes(retrieved, query_str=QUERIES["faiss"])
    asynced = asyncio.run(
        rerank.apostprocess_nodes(retrieved, query_str=QUERIES["faiss"])
    )
    assert [(n.node.node_id, n.score) for n in asynced] == [
        (n.node.node_id, n.score) for n in sync
    ]
    assert sync[0].node.node_id == "faiss"


# -- the client and Cohere's --------------------------------------------------------


def test_client_rerank_sync_and_async_agree(live):
    query = QUERIES["python"]
    documents = [
        {"text": t, "id": k, "score": float(i)}
        for i, (k, t) in enumerate(CORPUS.items())
    ]
    with NormcalClient(live.url) as nc:
        sync = nc.rerank(query, documents, top_n=2, return_documents=True)

    async def run():
        async with AsyncNormcalClient(live.url) as nc:
            return await nc.rerank(query, documents, top_n=2, return_documents=True)

    asynced = asyncio.run(run())
    assert asynced.model_dump() == sync.model_dump()
    assert sync.results[0].id == "python" and len(sync.results) == 2
    assert sync.results[0].document is not None
    assert sync.results[0].document.text == CORPUS["python"]


def test_cohere_client_reranks_against_normcal_unchanged(live):
    cohere = pytest.importorskip("cohere")
    query = QUERIES["aspirin"]
    # closed when done: its open connection would warn in whichever test runs next
    with cohere.Client(base_url=live.url, api_key="unused", timeout=60) as co:
        answer = co.rerank(
            model="rerank-v3.5",
            query=query,
            documents=TEXTS,
            top_n=3,
            return_documents=True,
        )
    ours = _rerank(live, query, TEXTS)
    assert [r.index for r in answer.results] == [r.index for r in ours.results[:3]]
    assert [r.relevance_score for r in answer.results] == [
        r.probability for r in ours.results[:3]
    ]
    assert answer.results[0].index == KEYS.index("aspirin")
    assert answer.results[0].document.text == CORPUS["aspirin"]
    # normcal's extra fields reach the Cohere client's objects.
    assert answer.results[0].probability_interval is not None
