"""``rerank()`` and the two rerankers checked on the wire, over a mock transport.

No server and no model: what each sends (texts in the retriever's order, ids, the
retriever's scores all or none, never the metadata), and what each makes of an
answer (drop, keep, annotate, abstain). Against a live server behind retrievers that
are not normcal: ``tests/client/test_rerankers.py``.
"""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from normcal_client import AsyncNormcalClient, NormcalClient, RerankResponse
from normcal_client._integration import retriever_scores


def _answer(probabilities, *, abstain=False, order=None, calibrated=True):
    """The service's answer: result ``i`` is document ``order[i]``."""
    order = order or list(range(len(probabilities)))
    return {
        "results": [
            {
                "index": index,
                "relevance_score": p if calibrated else 0.5,
                "probability": p if calibrated else None,
                "probability_interval": [p / 2, min(1.0, p * 1.5)]
                if calibrated
                else None,
                "score": 0.8 - rank / 10,
            }
            for rank, (index, p) in enumerate(zip(order, probabilities, strict=True))
        ],
        "confidence": 0.7,
        "confidence_interval": [0.5, 0.8],
        "abstain": abstain,
        "calibrator": {"status": "default", "id": "external-default", "default": True},
        "model": "m",
    }


def _client(answer):
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/v1/rerank"
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answer)

    return NormcalClient("http://mock", transport=httpx.MockTransport(handler)), seen


def test_rerank_sends_texts_and_objects_in_order():
    client, seen = _client(_answer([0.9, 0.1]))
    response = client.rerank(
        "q", ["first", {"text": "second", "id": "b", "score": 3}], top_n=2
    )
    assert isinstance(response, RerankResponse)
    assert seen == [
        {
            "query": "q",
            "documents": [
                {"text": "first"},
                {"text": "second", "id": "b", "score": 3.0},
            ],
            "top_n": 2,
        }
    ]
    assert response.results[0].probability_interval == (0.45, 1.0)
    with pytest.raises(TypeError):
        client.rerank("q", "one string")  # type: ignore[arg-type]


def test_async_rerank_sends_the_same():
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=_answer([0.3]))

    async def run():
        async with AsyncNormcalClient(
            "http://mock", transport=httpx.MockTransport(handler)
        ) as nc:
            return await nc.rerank("q", ["a"], collection="ns", return_documents=True)

    assert asyncio.run(run()).results[0].index == 0
    assert seen == [
        {
            "query": "q",
            "documents": [{"text": "a"}],
            "collection": "ns",
            "return_documents": True,
        }
    ]


@pytest.mark.parametrize(
    ("scores", "sent"),
    [
        ([3, 1.5, -2], [3.0, 1.5, -2.0]),
        ([3, None, 1], None),
        ([3, math.nan], None),
        ([3, "high"], None),
        ([True, False], None),
        ([], None),
    ],
)
def test_retriever_scores_go_all_or_none(scores, sent):
    assert retriever_scores(scores) == sent


# -- LangChain ----------------------------------------------------------------------


def test_langchain_reranker_drops_keeps_and_annotates():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from normcal_client.langchain import NormcalReranker

    documents = [
        Document(id="a", page_content="alpha", metadata={"src": "x", "bm25": 2.0}),
        Document(page_content="beta", metadata={"src": "y", "bm25": 1.0}),
        Document(id="c", page_content="gamma", metadata={"probability": "own"}),
    ]
    client, seen = _client(_answer([0.8, 0.4, 0.05], order=[1, 0, 2]))
    reranker = NormcalReranker(client=client, min_probability=0.3, top_n=3)
    kept = reranker.compress_documents(documents, "which?")
    # No scores sent: the third document has none; no metadata ever.
    assert seen[0] == {
        "query": "which?",
        "documents": [
            {"text": "alpha", "id": "a"},
            {"text": "beta"},
            {"text": "gamma", "id": "c"},
        ],
        "top_n": 3,
    }
    assert [d.page_content for d in kept] == ["beta", "alpha"]  # 0.05 dropped
    assert kept[0].id is None and kept[1].id == "a"
    assert kept[0].metadata == {
        "src": "y",
        "bm25": 1.0,
        "relevance_score": 0.8,
        "probability": 0.8,
        "probability_interval": [0.4, 1.0],
        "cosine": 0.8,
        "input_rank": 1,
        "confidence": 0.7,
        "calibrator": "external-default",
    }
    assert documents[1].metadata == {"src": "y", "bm25": 1.0}  # not touched


def test_langchain_reranker_sends_the_retrievers_scores_when_all_have_one():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from normcal_client.langchain import NormcalReranker

    documents = [
        Document(page_content=t, metadata={"bm25": s})
        for t, s in [("a", 7), ("b", 2.5)]
    ]
    client, seen = _client(_answer([0.6, 0.2]))
    NormcalReranker(
        client=client, score_key="bm25", collection="ns"
    ).compress_documents(documents, "q")
    assert seen[0]["documents"] == [
        {"text": "a", "score": 7.0},
        {"text": "b", "score": 2.5},
    ]
    assert seen[0]["collection"] == "ns"


def test_langchain_reranker_abstains_unless_told_not_to():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from normcal_client.langchain import NormcalReranker

    documents = [Document(page_content="a")]
    client, _ = _client(_answer([0.1], abstain=True))
    assert NormcalReranker(client=client).compress_documents(documents, "q") == []
    kept = NormcalReranker(client=client, honour_abstain=False).compress_documents(
        documents, "q"
    )
    assert [d.metadata["probability"] for d in kept] == [0.1]
    # Nothing to rerank: no request.
    client, seen = _client(_answer([]))
    assert NormcalReranker(client=client).compress_documents([], "q") == []
    assert seen == []


def test_langchain_reranker_refuses_a_threshold_without_a_probability():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from normcal_client.langchain import NormcalReranker

    client, _ = _client(_answer([0.5], calibrated=False))
    documents = [Document(page_content="a")]
    with pytest.raises(ValueError, match="no probability"):
        NormcalReranker(client=client, min_probability=0.2).compress_documents(
            documents, "q"
        )
    kept = NormcalReranker(client=client).compress_documents(documents, "q")
    assert kept[0].metadata["probability"] is None
    assert kept[0].metadata["probability_interval"] is None
    with pytest.raises(ValueError):
        NormcalReranker(min_probability=1.5)
    with pytest.raises(ValueError):
        NormcalReranker(top_n=0)


# -- LlamaIndex ---------------------------------------------------------------------


def test_llama_index_rerank_scores_by_probability_and_copies_nodes():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode
    from normcal_client.llama_index import NormcalRerank

    nodes = [
        NodeWithScore(
            node=TextNode(id_="n1", text="alpha", metadata={"k": 1}), score=4.0
        ),
        NodeWithScore(node=TextNode(id_="n2", text="beta"), score=1.5),
    ]
    client, seen = _client(_answer([0.9, 0.2], order=[1, 0]))
    rerank = NormcalRerank(client=client, top_n=2)
    out = rerank.postprocess_nodes(nodes, query_str="q")
    assert seen[0] == {
        "query": "q",
        "documents": [
            {"text": "k: 1\n\nalpha", "id": "n1", "score": 4.0},  # embed metadata
            {"text": "beta", "id": "n2", "score": 1.5},
        ],
        "top_n": 2,
    }
    assert [(n.node.node_id, n.score) for n in out] == [("n2", 0.9), ("n1", 0.2)]
    assert out[1].node.metadata["probability_interval"] == pytest.approx([0.1, 0.3])
    assert out[1].node.metadata["k"] == 1 and out[1].node.metadata["input_rank"] == 0
    # normcal's numbers stay out of what an LLM or the embedding model reads.
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        assert out[1].node.get_content(metadata_mode=mode) == "k: 1\n\nalpha"
    # The retriever's nodes are not changed.
    assert nodes[0].node.metadata == {"k": 1} and nodes[0].score == 4.0
    assert nodes[0].node.excluded_llm_metadata_keys == []


def test_llama_index_rerank_drops_abstains_and_needs_a_query():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from normcal_client.llama_index import NormcalRerank

    nodes = [NodeWithScore(node=TextNode(text=t), score=None) for t in ("a", "b")]
    client, seen = _client(_answer([0.7, 0.1]))
    out = NormcalRerank(client=client, min_probability=0.5).postprocess_nodes(
        nodes, QueryBundle("q")
    )
    assert [n.score for n in out] == [0.7]
    assert "score" not in seen[0]["documents"][0]  # the retriever gave none
    client, _ = _client(_answer([0.7, 0.1], abstain=True))
    assert NormcalRerank(client=client).postprocess_nodes(nodes, query_str="q") == []
    kept = NormcalRerank(client=client, honour_abstain=False).postprocess_nodes(
        nodes, query_str="q"
    )
    assert len(kept) == 2
    with pytest.raises(ValueError, match="query"):
        NormcalRerank(client=client).postprocess_nodes(nodes)
    assert NormcalRerank(client=client).postprocess_nodes([], query_str="q") == []
