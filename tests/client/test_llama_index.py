"""normcal_client.llama_index against the real service, through llama-index-core's
own interfaces: ``BaseRetriever.retrieve``, ``VectorStoreIndex.from_vector_store``,
``store.add`` / ``delete`` / ``query`` (what each sends is checked over a mock
transport in clients/python/tests/test_llama_index.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from normcal_client import NormcalClient

from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import source_env

pytest.importorskip("llama_index.core")

from llama_index.core import Document, MockEmbedding, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import (
    NodeRelationship,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from normcal_client.llama_index import (
    REF_DOC_ID,
    NormcalRetriever,
    NormcalVectorStore,
    nodes_from_result,
    to_filter,
)

YEARS = {"aspirin": 1990, "python": 2005, "paris": 1850, "photosynthesis": 2010}
DOCS = [
    {
        "id": key,
        "text": text,
        "metadata": {"topic": key, **({"year": YEARS[key]} if key in YEARS else {})},
    }
    for key, text in CORPUS.items()
]
F = MetadataFilter


@pytest.mark.slow  # starts a Python process
def test_service_cli_and_client_do_not_import_llama_index():
    """LlamaIndex is the client's optional extra: nothing else may need it."""
    code = (
        "import sys, app.api.app, app.cli.main, normcal_client; "
        "assert 'llama_index' not in sys.modules, 'llama_index imported'"
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


def test_retriever_scores_nodes_with_the_service_probabilities(kb):
    retriever = NormcalRetriever("kb", base_url=kb.url, similarity_top_k=3)
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve(QueryBundle(QUERIES["paris"]))
    with NormcalClient(kb.url) as nc:
        result = nc.search("kb", QUERIES["paris"], k=3, include_text=True)
    assert not result.abstain
    assert [(n.node.node_id, n.score) for n in nodes] == [
        (h.id, h.probability) for h in result.hits
    ]
    assert nodes == nodes_from_result(result)
    top = nodes[0].node
    assert top.node_id == "paris" and top.get_content() == CORPUS["paris"]
    assert top.metadata["topic"] == "paris" and top.metadata["norm"] > 0
    assert 0 < nodes[0].score <= 1  # the shipped default profile applies
    retriever.similarity_top_k = 1
    assert [n.node.node_id for n in retriever.retrieve(QUERIES["paris"])] == ["paris"]


def test_retriever_follows_the_service_and_takes_modes(kb):
    with NormcalClient(kb.url) as nc:
        # Whatever the service decides (abstain too), the retriever returns that.
        faiss_only = MetadataFilters(filters=[F(key="topic", value="faiss")])
        retriever = NormcalRetriever("kb", client=nc, filters=faiss_only)
        for query in (QUERIES["paris"], QUERIES["faiss"], "zxqv blorp"):
            result = nc.search(
                "kb", query, filter=to_filter(faiss_only), k=4, include_text=True
            )
            assert retriever.retrieve(query) == nodes_from_result(result)
        retriever.honour_abstain = False
        assert [n.node.node_id for n in retriever.retrieve(QUERIES["paris"])] == [
            "faiss"
        ]
        retriever.filters, retriever.similarity_top_k = None, 5
        retriever.mode = "lexical"
        lexical = {n.node.node_id for n in retriever.retrieve("capital chemical")}
        assert lexical == {"paris", "photosynthesis"}


# A LlamaIndex filter, its normcal form, and the documents it selects.
FILTERS = [
    (
        MetadataFilters(filters=[F(key="year", value=2000, operator=">=")]),
        {"python", "photosynthesis"},
    ),
    (
        MetadataFilters(
            filters=[
                F(key="topic", value=["paris", "faiss"], operator=FilterOperator.IN),
                F(key="year", value=2000, operator=FilterOperator.LT),
            ],
            condition=FilterCondition.OR,
        ),
        {"paris", "faiss", "aspirin"},
    ),
    (
        MetadataFilters(
            filters=[
                F(key="year", value=1990),
                MetadataFilters(
                    filters=[F(key="topic", value="faiss")],
                    condition=FilterCondition.OR,
                ),
            ],
            condition=FilterCondition.NOT,
        ),
        {"python", "paris", "photosynthesis"},
    ),
    (  # $ne and $nin hold for a missing key, as in LlamaIndex's SimpleVectorStore.
        MetadataFilters(
            filters=[
                F(key="year", value=2005, operator=FilterOperator.NE),
                F(key="topic", value=["paris"], operator=FilterOperator.NIN),
            ]
        ),
        {"aspirin", "photosynthesis", "faiss"},
    ),
]


@pytest.mark.parametrize(("filters", "expected"), FILTERS)
def test_metadata_filters_select_on_the_server(kb, filters, expected):
    retriever = NormcalRetriever(
        "kb",
        base_url=kb.url,
        similarity_top_k=5,
        filters=filters,
        honour_abstain=False,
    )
    assert {n.node.node_id for n in retriever.retrieve(QUERIES["faiss"])} == expected
    store = NormcalVectorStore("kb", base_url=kb.url)
    query = VectorStoreQuery(query_str="anything", similarity_top_k=5, filters=filters)
    assert set(store.query(query).ids) == expected
    with NormcalClient(kb.url) as nc:
        served = nc.search("kb", "q", k=5, filter=to_filter(filters))
    assert {h.id for h in served.hits} == expected


def _nodes():
    """Two chunks of one source document and one of another."""

    def chunk(node_id: str, key: str, source: str) -> TextNode:
        return TextNode(
            id_=node_id,
            text=CORPUS[key],
            metadata={"topic": key},
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=source)},
        )

    return [
        chunk("s1-a", "aspirin", "src-1"),
        chunk("s1-b", "python", "src-1"),
        chunk("s2-a", "paris", "src-2"),
    ]


@pytest.fixture
def store(live, request):
    name = request.node.name.replace("[", "-").replace("]", "")[:60]
    with NormcalClient(live.url) as nc:
        nc.create_collection(name)
        yield NormcalVectorStore(name, base_url=live.url)
        nc.delete_collection(name)


def test_vector_store_add_query_delete(store):
    assert store.add(_nodes()) == ["s1-a", "s1-b", "s2-a"]
    result = store.query(VectorStoreQuery(query_str=QUERIES["paris"]))
    assert result.ids == ["s2-a"]
    node = result.nodes[0]
    assert node.ref_doc_id == "src-2" and node.metadata == {"topic": "paris"}
    with NormcalClient(store._endpoint.base_url) as nc:
        stored = nc.get_document(store.collection, "s2-a")
        hit = nc.search(store.collection, QUERIES["paris"], k=1).hits[0]
    assert stored.metadata == {"topic": "paris", REF_DOC_ID: "src-2"}
    assert result.similarities == [hit.probability]
    both = store.query(
        VectorStoreQuery(query_str="medicine", similarity_top_k=3, doc_ids=["src-1"])
    )
    assert set(both.ids) == {"s1-a", "s1-b"}
    store.delete("src-1")
    assert [n.node_id for n in store.get_nodes(["s1-a", "s1-b", "s2-a"])] == ["s2-a"]
    store.delete("no-such-source")  # deleting nothing is no error
    lexical = store.query(
        VectorStoreQuery(
            query_str="capital",
            mode=VectorStoreQueryMode.TEXT_SEARCH,
            similarity_top_k=3,
        )
    )
    assert lexical.ids == ["s2-a"]


def test_vector_store_delete_nodes_and_clear(store):
    store.add(_nodes())
    store.delete_nodes(["s1-a", "unknown"])
    store.delete_nodes(filters=MetadataFilters(filters=[F(key="topic", value="paris")]))
    assert [n.node_id for n in store.get_nodes(["s1-a", "s1-b", "s2-a"])] == ["s1-b"]
    store.clear()
    assert store.get_nodes(["s1-b"]) == []


def test_vector_store_index_needs_no_embedding_model(store):
    """VectorStoreIndex resolves an embed model when built (None means LlamaIndex's
    default, OpenAI), so it is given MockEmbedding; with ``is_embedding_query`` off
    its retriever never calls it, and inserted documents are embedded by the service.
    """
    index = VectorStoreIndex.from_vector_store(
        store, embed_model=MockEmbedding(embed_dim=1)
    )
    document = Document(text=CORPUS["faiss"], metadata={"topic": "faiss"})
    index.insert(document)
    store.add(_nodes())
    nodes = index.as_retriever(similarity_top_k=2).retrieve(QUERIES["faiss"])
    assert nodes[0].node.ref_doc_id == document.doc_id
    assert nodes[0].node.get_content() == CORPUS["faiss"]
    direct = NormcalRetriever(store.collection, base_url=store._endpoint.base_url)
    assert nodes[0].score == direct.retrieve(QUERIES["faiss"])[0].score
    hybrid = index.as_retriever(
        similarity_top_k=4,
        vector_store_query_mode="hybrid",
        vector_store_kwargs={"candidates": 4},
    ).retrieve("capital of France")
    assert hybrid[0].node.node_id == "s2-a"
    index.delete_ref_doc(document.doc_id)
    assert store.get_nodes([nodes[0].node.node_id]) == []


@pytest.mark.anyio
async def test_async_retriever_and_store(store):
    await store.async_add(_nodes())
    result = await store.aquery(VectorStoreQuery(query_str=QUERIES["aspirin"]))
    assert result.ids == ["s1-a"]
    retriever = NormcalRetriever(
        store.collection, base_url=store._endpoint.base_url, similarity_top_k=1
    )
    nodes = await retriever.aretrieve(QUERIES["aspirin"])
    assert [n.node.node_id for n in nodes] == ["s1-a"]
    assert nodes[0].score == result.similarities[0]
    await store.adelete("src-1")
    await store.adelete_nodes(["s2-a"])
    assert await store.aget_nodes(["s1-a", "s1-b", "s2-a"]) == []
    await store.async_add(_nodes())
    await store.aclear()
    assert await store.aget_nodes(["s1-a"]) == []


def test_a_store_of_own_vectors_sends_node_and_query_embeddings(live):
    """``own_vectors=True``: nodes carry their embedding, queries LlamaIndex's."""
    dim = 4
    axes = {
        key: [float(i == j) * (j + 1) for j in range(dim)]
        for i, key in enumerate(["aspirin", "python", "paris", "faiss"])
    }
    with NormcalClient(live.url) as nc:
        nc.create_collection("own-li", embedding={"dimension": dim, "model": "mine"})
        store = NormcalVectorStore("own-li", own_vectors=True, client=nc)
        assert store.is_embedding_query
        nodes = [TextNode(id_=k, text=CORPUS[k], embedding=v) for k, v in axes.items()]
        assert store.add(nodes) == list(axes)
        stored = nc.get_document("own-li", "paris")
        assert stored.norm == pytest.approx(3.0)  # the raw length of the sent vector
        found = store.query(
            VectorStoreQuery(
                query_embedding=[0.0, 0.0, 2.0, 0.0],
                query_str=QUERIES["paris"],
                similarity_top_k=2,
            )
        )
        assert found.ids is not None and found.ids[0] == "paris"
        with pytest.raises(ValueError, match="query_embedding"):
            store.query(VectorStoreQuery(query_str="x", similarity_top_k=1))
        with pytest.raises(ValueError):  # a node without its embedding
            store.add([TextNode(id_="bare", text="no vector")])
        # Through an index: LlamaIndex embeds the query (a mock here), normcal
        # searches by that vector with the text beside it.
        index = VectorStoreIndex.from_vector_store(
            store, embed_model=MockEmbedding(embed_dim=dim)
        )
        hits = index.as_retriever(similarity_top_k=4).retrieve(QUERIES["aspirin"])
        assert {h.node.node_id for h in hits} == set(axes)
        nc.delete_collection("own-li")


def test_nodes_come_in_the_order_of_the_probability_they_carry(kb):
    """Dense hits come by cosine from the service; LlamaIndex gets them by P."""
    retriever = NormcalRetriever("kb", base_url=kb.url, similarity_top_k=5)
    store = NormcalVectorStore("kb", base_url=kb.url)
    for query in QUERIES.values():
        scores = [n.score for n in retriever.retrieve(query)]
        assert scores == sorted(scores, reverse=True) and len(scores) == 5
        found = store.query(VectorStoreQuery(query_str=query, similarity_top_k=5))
        assert found.similarities == sorted(found.similarities, reverse=True)
