"""normcal_client.llama_index without a server: the filter mapping (pure logic) and
what the retriever and the vector store send and make of answers, over a mock
transport. Against a live server: ``tests/client/test_llama_index.py``.
"""

from __future__ import annotations

import json

import httpx
import pytest
from normcal_client import NormcalClient

pytest.importorskip("llama_index.core")

from llama_index.core.schema import (
    MetadataMode,
    NodeRelationship,
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
    to_filter,
)

F = MetadataFilter
SUPPORTED = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
}

# ---------------------------------------------------------------- filter mapping


@pytest.mark.parametrize(("operator", "expected"), SUPPORTED.items())
def test_each_operator_maps_to_its_equivalent(operator, expected):
    value = [1, 2] if operator in (FilterOperator.IN, FilterOperator.NIN) else 3
    one = MetadataFilters(filters=[F(key="year", value=value, operator=operator)])
    assert to_filter(one) == {"year": {expected: value}}


@pytest.mark.parametrize(
    "operator", sorted(set(FilterOperator) - set(SUPPORTED), key=str)
)
def test_operators_without_an_equivalent_raise_naming_the_operator(operator):
    value = ["x"] if operator in (FilterOperator.ANY, FilterOperator.ALL) else "x"
    inner = MetadataFilters(filters=[F(key="tags", value=value, operator=operator)])
    nested = MetadataFilters(filters=[F(key="a", value=1), inner])
    with pytest.raises(NotImplementedError, match=operator.name):
        to_filter(nested)


def test_conditions_and_nesting():
    a, b = F(key="a", value=1), F(key="b", value="x", operator=FilterOperator.NE)
    assert to_filter(MetadataFilters(filters=[a, b])) == {
        "$and": [{"a": {"$eq": 1}}, {"b": {"$ne": "x"}}]
    }
    assert to_filter(MetadataFilters(filters=[a, b], condition=FilterCondition.OR)) == {
        "$or": [{"a": {"$eq": 1}}, {"b": {"$ne": "x"}}]
    }
    # NOT: none of them holds, as in LlamaIndex's own stores.
    assert to_filter(
        MetadataFilters(filters=[a, b], condition=FilterCondition.NOT)
    ) == {"$not": {"$or": [{"a": {"$eq": 1}}, {"b": {"$ne": "x"}}]}}
    assert to_filter(MetadataFilters(filters=[a], condition=FilterCondition.NOT)) == {
        "$not": {"a": {"$eq": 1}}
    }
    nested = MetadataFilters(
        filters=[a, MetadataFilters(filters=[a, b], condition=FilterCondition.OR)],
        condition=FilterCondition.AND,
    )
    assert to_filter(nested) == {
        "$and": [
            {"a": {"$eq": 1}},
            {"$or": [{"a": {"$eq": 1}}, {"b": {"$ne": "x"}}]},
        ]
    }


def test_no_filter_is_none_and_a_dict_is_normcal_s_own():
    assert to_filter(None) is None
    assert to_filter(MetadataFilters(filters=[])) is None
    assert to_filter({"year": {"$gte": 2000}}) == {"year": {"$gte": 2000}}
    with pytest.raises(ValueError, match="nested"):
        to_filter(MetadataFilters(filters=[MetadataFilters(filters=[])]))


# ---------------------------------------------------------------- over the wire


def _answer(abstain, probabilities):
    return {
        "query": {"norm": 3.5, "n_tokens": 6, "truncated": False},
        "mode": "dense",
        "hits": [
            {
                "id": f"d{i}",
                "score": 0.9 - i / 10,
                "bm25": 0.0,
                "probability": p,
                "norm": 4.0,
                "n_tokens": 7,
                "metadata": {"lang": "en", REF_DOC_ID: "src", "probability": "own"},
                "text": f"text {i}",
            }
            for i, p in enumerate(probabilities)
        ],
        "confidence": 0.4,
        "abstain": abstain,
        "calibrator": {
            "status": "fitted",
            "id": "cal-7",
            "method": "nt-list",
            "default": False,
        },
    }


def _mock(answer=None):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer if answer is not None else {})

    return NormcalClient("http://mock", transport=httpx.MockTransport(handler)), seen


def test_retriever_scores_probabilities_and_hides_normcal_numbers_from_the_llm():
    client, seen = _mock(_answer(False, [0.91, 0.55]))
    filters = MetadataFilters(filters=[F(key="lang", value="en")])
    retriever = NormcalRetriever(
        "kb", client=client, similarity_top_k=2, filters=filters, mode="hybrid"
    )
    nodes = retriever.retrieve("q")
    assert json.loads(seen[0].content) == {
        "query": "q",
        "k": 2,
        "mode": "hybrid",
        "filter": {"lang": {"$eq": "en"}},
        "include_text": True,
    }
    assert [(n.node.node_id, n.score) for n in nodes] == [("d0", 0.91), ("d1", 0.55)]
    node = nodes[0].node
    assert node.metadata["probability"] == 0.91  # normcal's numbers win a clash
    assert node.metadata["calibrator"] == "cal-7" and node.metadata["rank"] == 0
    assert node.ref_doc_id == "src" and REF_DOC_ID not in node.metadata
    assert node.get_content(MetadataMode.LLM) == "lang: en\n\ntext 0"
    retriever.similarity_top_k = 1  # attributes apply to the calls that follow
    retriever.retrieve("q")
    assert json.loads(seen[1].content)["k"] == 1


def test_retriever_abstains_unless_told_not_to():
    client, _ = _mock(_answer(True, [0.2]))
    assert NormcalRetriever("kb", client=client).retrieve("q") == []
    kept = NormcalRetriever("kb", client=client, honour_abstain=False).retrieve("q")
    assert [n.score for n in kept] == [0.2]


def test_without_a_calibrator_the_score_is_the_cosine_only_when_asked():
    client, _ = _mock(_answer(False, [None]))
    with pytest.raises(ValueError, match='similarity="cosine"'):
        NormcalRetriever("kb", client=client).retrieve("q")
    cosine = NormcalRetriever("kb", client=client, similarity="cosine")
    assert [n.score for n in cosine.retrieve("q")] == [0.9]
    store = NormcalVectorStore("kb", client=client, similarity="cosine")
    assert store.query(VectorStoreQuery(query_str="q")).similarities == [0.9]


def test_retriever_probability_bounds():
    for name in ("min_probability", "target_precision"):
        for bad in (-0.1, 1.5):
            with pytest.raises(ValueError, match=name):
                NormcalRetriever("kb", **{name: bad})
        NormcalRetriever("kb", **{name: 0.0})
        NormcalRetriever("kb", **{name: 1.0})


def test_store_add_sends_text_metadata_and_ref_doc_id_not_the_embedding():
    client, seen = _mock({"upserted": 1, "ids": ["n1"], "truncated": []})
    node = TextNode(
        id_="n1",
        text="body",
        metadata={"lang": "en"},
        embedding=[0.1, 0.2],
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="src")},
    )
    assert NormcalVectorStore("kb", client=client).add([node]) == ["n1"]
    assert json.loads(seen[0].content) == {
        "documents": [
            {"id": "n1", "text": "body", "metadata": {"lang": "en", REF_DOC_ID: "src"}}
        ]
    }


def test_store_delete_is_by_ref_doc_id():
    client, seen = _mock({"deleted": 2})
    NormcalVectorStore("kb", client=client).delete("src")
    assert seen[0].url.path.endswith("/documents/delete")
    assert json.loads(seen[0].content) == {"filter": {REF_DOC_ID: "src"}}
    with pytest.raises(TypeError, match="not a delete option"):
        NormcalVectorStore("kb", client=client).delete("src", cascade=True)


def test_store_query_maps_modes_filters_and_doc_ids():
    client, seen = _mock(_answer(True, [0.3]))
    store = NormcalVectorStore("kb", client=client, mode="lexical")
    query = VectorStoreQuery(
        query_str="q",
        similarity_top_k=3,
        doc_ids=["src"],
        filters=MetadataFilters(filters=[F(key="lang", value="en")]),
    )
    result = store.query(query, min_probability=0.1)
    assert json.loads(seen[0].content) == {
        "query": "q",
        "k": 3,
        "mode": "lexical",
        "filter": {"$and": [{"lang": {"$eq": "en"}}, {REF_DOC_ID: {"$in": ["src"]}}]},
        "include_text": True,
        "min_probability": 0.1,
    }
    # The store returns the top k whatever the abstain decision.
    assert result.ids == ["d0"] and result.similarities == [0.3]
    store.query(VectorStoreQuery(query_str="q", node_ids=[]))  # as_retriever's
    assert result.nodes[0].metadata == {"lang": "en", "probability": "own"}
    for mode, sent in (
        (VectorStoreQueryMode.HYBRID, "hybrid"),
        (VectorStoreQueryMode.TEXT_SEARCH, "lexical"),
        (VectorStoreQueryMode.SPARSE, "lexical"),
        (VectorStoreQueryMode.DEFAULT, "lexical"),  # the store's own mode
    ):
        store.query(VectorStoreQuery(query_str="q", mode=mode))
        assert json.loads(seen[-1].content)["mode"] == sent


@pytest.mark.parametrize(
    ("query", "kwargs", "error", "match"),
    [
        (VectorStoreQuery(query_embedding=[0.1]), {}, ValueError, "query_str"),
        (
            VectorStoreQuery(query_str="q", node_ids=["a"]),
            {},
            NotImplementedError,
            "node_ids",
        ),
        (
            VectorStoreQuery(query_str="q", mode=VectorStoreQueryMode.MMR),
            {},
            NotImplementedError,
            "'mmr'",
        ),
        (VectorStoreQuery(query_str="q"), {"alpha2": 1}, TypeError, "alpha2"),
    ],
)
def test_store_query_refuses_what_it_cannot_do_before_sending(
    query, kwargs, error, match
):
    client, seen = _mock()
    with pytest.raises(error, match=match):
        NormcalVectorStore("kb", client=client).query(query, **kwargs)
    assert seen == []


def test_store_get_and_delete_nodes_refuse_what_the_service_cannot_select():
    client, seen = _mock()
    store = NormcalVectorStore("kb", client=client)
    filters = MetadataFilters(filters=[F(key="a", value=1)])
    with pytest.raises(NotImplementedError, match="not by filters"):
        store.get_nodes(filters=filters)
    with pytest.raises(NotImplementedError, match="not by both"):
        store.delete_nodes(["a"], filters=filters)
    with pytest.raises(ValueError, match="clear"):
        store.delete_nodes()
    assert seen == []


def test_nodes_come_in_the_order_of_the_score_they_carry():
    """A dense search lists hits by cosine; their probabilities may not descend."""
    client, _ = _mock(_answer(False, [0.30, 0.80, 0.55]))  # cosines 0.9, 0.8, 0.7
    nodes = NormcalRetriever("kb", client=client).retrieve("q")
    assert [(n.node.node_id, n.score) for n in nodes] == [
        ("d1", 0.80),
        ("d2", 0.55),
        ("d0", 0.30),
    ]
    assert [n.node.metadata["rank"] for n in nodes] == [0, 1, 2]
    store = NormcalVectorStore("kb", client=client)
    found = store.query(VectorStoreQuery(query_str="q", similarity_top_k=3))
    assert found.ids == ["d1", "d2", "d0"] and found.similarities == [0.8, 0.55, 0.3]
    by_cosine = NormcalVectorStore("kb", client=client, similarity="cosine")
    assert by_cosine.query(VectorStoreQuery(query_str="q")).ids == ["d0", "d1", "d2"]
