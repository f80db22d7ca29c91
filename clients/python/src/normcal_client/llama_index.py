"""LlamaIndex integration (``pip install "normcal-client[llama-index]"``).

:class:`NormcalRetriever` is a LlamaIndex retriever over a collection: each
``NodeWithScore`` scores the calibrated probability of relevance, normcal's numbers
are in the node's metadata (kept out of what an LLM or an embedding model sees), and
it returns nothing when the service abstains. :class:`NormcalVectorStore` is a
LlamaIndex vector store over a collection (add, delete by ``ref_doc_id``, query)
whose similarities are the calibrated probabilities. Both embed on the server with
the collection's model: no embedding model is needed here, a node's ``embedding`` is
not sent, and the store asks LlamaIndex for no query embedding
(``is_embedding_query = False``) — except a store with ``own_vectors=True``, over a
collection of the client's own vectors, which sends both. :func:`to_filter` maps LlamaIndex
``MetadataFilters`` onto normcal's filter language and refuses what has no
equivalent there. :class:`NormcalRerank` is a node postprocessor over any retriever
(BM25, another vector store): it calibrates that retriever's nodes through the
service's ``/v1/rerank`` and scores each by its probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from pydantic import Field, PrivateAttr

from normcal_client._async_client import AsyncNormcalClient
from normcal_client._base import DEFAULT_URL
from normcal_client._errors import refused
from normcal_client._integration import (
    HIT_KEYS,
    RERANK_KEYS,
    Connection,
    best_first,
    hit_metadata,
    kept_results,
    rerank_documents,
    rerank_metadata,
)
from normcal_client._models import (
    DocumentIn,
    DocumentOut,
    FilterJSON,
    RerankResponse,
    SearchHit,
    SearchMode,
    SearchResult,
)
from normcal_client._sync_client import NormcalClient

__all__ = [
    "REF_DOC_ID",
    "NormcalRerank",
    "NormcalRetriever",
    "NormcalVectorStore",
    "nodes_from_result",
    "to_filter",
]

REF_DOC_ID = "ref_doc_id"
"""Metadata key of a node's source document id (what ``delete(ref_doc_id)`` matches)."""

Similarity = Literal["probability", "cosine"]
"""What a node's score is: calibrated P(relevant) (the default) or the cosine."""

# -- filters

_OPERATORS = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
}


def to_filter(filters: MetadataFilters | FilterJSON | None) -> FilterJSON | None:
    """Normcal's filter for LlamaIndex ``filters`` (a dict is normcal's already).

    Operators map one to one (``==`` to ``$eq``, ``in`` to ``$in``, ...), conditions
    to ``$and`` / ``$or``, and ``not`` to ``$not`` of the ``$or`` (none holds, as in
    LlamaIndex's own stores); nested ``MetadataFilters`` nest. No filter, or none in
    the list, is None. An operator normcal has no equivalent for (``text_match``,
    ``contains``, ``any``, ``all``, ``is_empty``, ...) raises ``NotImplementedError``
    naming it: a filter is never dropped.
    """
    if filters is None or isinstance(filters, dict):
        return filters
    if not filters.filters:
        return None
    return _group(filters)


def _group(filters: MetadataFilters) -> FilterJSON:
    if not filters.filters:
        raise refused("filters", "a nested MetadataFilters needs at least one filter")
    parts = [
        _group(f) if isinstance(f, MetadataFilters) else _condition(f)
        for f in filters.filters
    ]
    condition = filters.condition or FilterCondition.AND
    if condition == FilterCondition.NOT:
        return {"$not": _join("$or", parts)}
    return _join("$or" if condition == FilterCondition.OR else "$and", parts)


def _condition(f: MetadataFilter) -> FilterJSON:
    operator = _OPERATORS.get(f.operator)
    if operator is None:
        raise NotImplementedError(
            f"normcal's filters have no equivalent of the LlamaIndex operator"
            f" {f.operator.name} ({f.operator.value!r}, on key {f.key!r}); they take"
            f" {', '.join(o.name for o in _OPERATORS)} and the conditions AND, OR, NOT"
        )
    return {f.key: {operator: f.value}}


def _join(operator: str, parts: list[FilterJSON]) -> FilterJSON:
    return parts[0] if len(parts) == 1 else {operator: parts}


def _both(first: FilterJSON | None, second: FilterJSON | None) -> FilterJSON | None:
    if first is None or second is None:
        return first if second is None else second
    return {"$and": [first, second]}


# -- nodes


def _document_in(node: BaseNode, own_vectors: bool = False) -> DocumentIn:
    """What is stored of a node: its id, text, metadata and ``ref_doc_id``.

    The service embeds the text with the collection's model, so ``node.embedding``
    is not sent, unless the collection takes vectors of its own (``own_vectors``):
    then it is the document's vector and must be there.
    """
    metadata = dict(node.metadata)
    if node.ref_doc_id is not None:
        metadata[REF_DOC_ID] = node.ref_doc_id
    document = DocumentIn(
        id=node.node_id,
        text=node.get_content(metadata_mode=MetadataMode.NONE),
        metadata=metadata,
    )
    if own_vectors:
        document.vector = node.get_embedding()
    return document


def _text_node(
    doc_id: str, text: str, metadata: dict[str, Any], hidden: Sequence[str] = ()
) -> TextNode:
    """A stored document as a node: ``ref_doc_id`` back in its relationships."""
    metadata = dict(metadata)
    ref_doc_id = metadata.pop(REF_DOC_ID, None)
    relationships = (
        {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=str(ref_doc_id))}
        if ref_doc_id is not None
        else {}
    )
    return TextNode(
        id_=doc_id,
        text=text,
        metadata=metadata,
        relationships=relationships,
        excluded_embed_metadata_keys=list(hidden),
        excluded_llm_metadata_keys=list(hidden),
    )


def _node(document: DocumentOut) -> TextNode:
    return _text_node(document.id, document.text, document.metadata)


def _similarity(hit: SearchHit, similarity: Similarity) -> float:
    if similarity == "cosine":
        return hit.score
    if hit.probability is None:
        raise ValueError(
            "no calibrator applies to this collection, so there is no probability;"
            ' fit one, or pass similarity="cosine" for cosine similarities'
        )
    return hit.probability


def nodes_from_result(
    result: SearchResult,
    *,
    honour_abstain: bool = True,
    similarity: Similarity = "probability",
) -> list[NodeWithScore]:
    """LlamaIndex nodes of one result, scored, normcal's numbers in their metadata.

    The metadata is the document's own plus ``id``, ``score`` (cosine),
    ``probability``, ``norm``, ``n_tokens``, ``rank``, the query's ``confidence``
    and the ``calibrator`` id (normcal's win a name clash), which are excluded from
    the node's LLM and embedding content. ``score`` is the probability (or the
    cosine with ``similarity="cosine"``), and the nodes come best score first
    (``rank`` is that order).
    """
    if honour_abstain and result.abstain:
        return []
    hits = _best_first(result, similarity)
    return [
        NodeWithScore(
            node=_text_node(hit.id, hit.text or "", metadata, HIT_KEYS),
            score=_similarity(hit, similarity),
        )
        for hit, metadata in zip(hits, hit_metadata(result, hits), strict=True)
    ]


def _best_first(result: SearchResult, similarity: Similarity) -> list[SearchHit]:
    """The hits in descending order of the score their nodes carry."""
    return best_first(result.hits, lambda hit: _similarity(hit, similarity))


# -- the retriever


class _Endpoint(Connection):
    """A :class:`Connection` held by a LlamaIndex object rather than mixed in."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float,
        client: NormcalClient | None,
        async_client: AsyncNormcalClient | None,
    ) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.client = client
        self.async_client = async_client


class NormcalRetriever(BaseRetriever):
    """Retrieve from a normcal collection, scored by calibrated probability.

    ``similarity_top_k``, ``mode``, ``candidates``, ``filters`` (LlamaIndex
    ``MetadataFilters`` or a normcal filter dict), ``min_probability`` and
    ``target_precision`` are sent with every query and applied by the service; they
    are plain attributes, so ``retriever.similarity_top_k = 2`` changes the calls
    that follow.
    """

    def __init__(
        self,
        collection: str,
        *,
        similarity_top_k: int = 4,
        mode: SearchMode = "dense",
        candidates: int | None = None,
        filters: MetadataFilters | FilterJSON | None = None,
        min_probability: float | None = None,
        target_precision: float | None = None,
        honour_abstain: bool = True,
        similarity: Similarity = "probability",
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float = 120.0,
        client: NormcalClient | None = None,
        async_client: AsyncNormcalClient | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        for name, bound in (
            ("min_probability", min_probability),
            ("target_precision", target_precision),
        ):
            if bound is not None and not 0.0 <= bound <= 1.0:
                raise refused(name, f"must be in [0, 1], not {bound}")
        self.collection = collection
        self.similarity_top_k = similarity_top_k
        self.mode: SearchMode = mode
        self.candidates = candidates
        self.filters = filters
        self.min_probability = min_probability
        self.target_precision = target_precision
        self.honour_abstain = honour_abstain
        self.similarity: Similarity = similarity
        self._endpoint = _Endpoint(base_url, api_key, timeout, client, async_client)

    def _search_kwargs(self) -> dict[str, Any]:
        return {
            "k": self.similarity_top_k,
            "mode": self.mode,
            "candidates": self.candidates,
            "filter": to_filter(self.filters),
            "min_probability": self.min_probability,
            "target_precision": self.target_precision,
            "include_text": True,
        }

    def _nodes(self, result: SearchResult) -> list[NodeWithScore]:
        return nodes_from_result(
            result, honour_abstain=self.honour_abstain, similarity=self.similarity
        )

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with self._endpoint._sync() as client:
            result = client.search(
                self.collection, query_bundle.query_str, **self._search_kwargs()
            )
        return self._nodes(result)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with self._endpoint._async() as client:
            result = await client.search(
                self.collection, query_bundle.query_str, **self._search_kwargs()
            )
        return self._nodes(result)


# -- the vector store

_MODES: dict[VectorStoreQueryMode, SearchMode] = {
    VectorStoreQueryMode.HYBRID: "hybrid",
    VectorStoreQueryMode.TEXT_SEARCH: "lexical",
    VectorStoreQueryMode.SPARSE: "lexical",
}
_QUERY_OPTIONS = {"mode", "candidates", "min_probability", "target_precision"}


class NormcalVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over one normcal collection.

    ``add`` upserts each node's id, text (``MetadataMode.NONE``: the service embeds
    the text alone), metadata and ``ref_doc_id`` (under the metadata key
    ``ref_doc_id``); ``delete(ref_doc_id)`` deletes the documents with that
    ``ref_doc_id``. ``query`` needs ``query_str`` (the service embeds it) and
    returns the top ``similarity_top_k`` whatever the service's abstain decision
    (use :class:`NormcalRetriever` to honour it), with the calibrated probabilities
    as similarities (``similarity="cosine"`` for cosines). The query mode default
    is the store's ``mode``; hybrid is normcal's hybrid, ranked by probability
    (``alpha`` is not used), text search and sparse are its BM25 ("lexical").
    ``vector_store_kwargs`` of a retriever (``candidates``, ``min_probability``,
    ``target_precision``, ``mode``) reach the service.

    ``own_vectors=True`` is for a collection created with ``embedding`` (the
    client's own vectors): nodes are sent with their ``embedding`` and queries with
    LlamaIndex's query embedding (``is_embedding_query``), its text beside it for
    BM25 and the probabilities.
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    flat_metadata: bool = False

    collection: str
    mode: SearchMode = "dense"
    similarity: Similarity = "probability"
    own_vectors: bool = False

    _endpoint: _Endpoint = PrivateAttr()

    def __init__(
        self,
        collection: str,
        *,
        mode: SearchMode = "dense",
        similarity: Similarity = "probability",
        own_vectors: bool = False,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float = 120.0,
        client: NormcalClient | None = None,
        async_client: AsyncNormcalClient | None = None,
    ) -> None:
        super().__init__(
            stores_text=True,
            is_embedding_query=own_vectors,
            collection=collection,
            mode=mode,
            similarity=similarity,
            own_vectors=own_vectors,
        )
        self._endpoint = _Endpoint(base_url, api_key, timeout, client, async_client)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of the class."""
        return "NormcalVectorStore"

    @property
    def client(self) -> NormcalClient | None:
        """The sync client given to the constructor, if any."""
        return self._endpoint.client

    # -- writing
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Upsert the nodes (by node id); returns their ids."""
        documents = [_document_in(node, self.own_vectors) for node in nodes]
        with self._endpoint._sync() as client:
            client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Upsert the nodes (by node id); returns their ids."""
        documents = [_document_in(node, self.own_vectors) for node in nodes]
        async with self._endpoint._async() as client:
            await client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete the documents whose ``ref_doc_id`` is this one."""
        _no_options(delete_kwargs)
        with self._endpoint._sync() as client:
            client.delete_documents_where(self.collection, {REF_DOC_ID: ref_doc_id})

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete the documents whose ``ref_doc_id`` is this one."""
        _no_options(delete_kwargs)
        async with self._endpoint._async() as client:
            await client.delete_documents_where(
                self.collection, {REF_DOC_ID: ref_doc_id}
            )

    def delete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the nodes with these ids, or those ``filters`` select (not both)."""
        _no_options(delete_kwargs)
        with self._endpoint._sync() as client:
            if node_ids is not None:
                client.delete_documents(
                    self.collection, _ids_only(node_ids, filters), missing_ok=True
                )
            else:
                client.delete_documents_where(self.collection, _selection(filters))

    async def adelete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the nodes with these ids, or those ``filters`` select (not both)."""
        _no_options(delete_kwargs)
        async with self._endpoint._async() as client:
            if node_ids is not None:
                await client.delete_documents(
                    self.collection, _ids_only(node_ids, filters), missing_ok=True
                )
            else:
                await client.delete_documents_where(
                    self.collection, _selection(filters)
                )

    def clear(self) -> None:
        """Delete every document of the collection (the collection stays)."""
        with self._endpoint._sync() as client:
            client.delete_documents_where(self.collection, all=True)

    async def aclear(self) -> None:
        """Delete every document of the collection (the collection stays)."""
        async with self._endpoint._async() as client:
            await client.delete_documents_where(self.collection, all=True)

    # -- reading
    def get_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
    ) -> list[BaseNode]:
        """The stored nodes among ``node_ids`` (unknown ids are skipped)."""
        with self._endpoint._sync() as client:
            found = client.get_documents(self.collection, _by_ids(node_ids, filters))
        return [_node(d) for d in found]

    async def aget_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
    ) -> list[BaseNode]:
        """The stored nodes among ``node_ids`` (unknown ids are skipped)."""
        async with self._endpoint._async() as client:
            found = await client.get_documents(
                self.collection, _by_ids(node_ids, filters)
            )
        return [_node(d) for d in found]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The top ``similarity_top_k`` nodes for ``query.query_str``."""
        text, options = self._search(query, kwargs)
        with self._endpoint._sync() as client:
            result = client.search(self.collection, text, **options)
        return self._result(result)

    async def aquery(
        self, query: VectorStoreQuery, **kwargs: Any
    ) -> VectorStoreQueryResult:
        """The top ``similarity_top_k`` nodes for ``query.query_str``."""
        text, options = self._search(query, kwargs)
        async with self._endpoint._async() as client:
            result = await client.search(self.collection, text, **options)
        return self._result(result)

    def _search(
        self, query: VectorStoreQuery, kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        unknown = set(kwargs) - _QUERY_OPTIONS
        if unknown:
            raise refused(
                sorted(unknown)[0],
                f"not a query option of normcal ({', '.join(sorted(_QUERY_OPTIONS))})",
            )
        vector = query.query_embedding if self.own_vectors else None
        if self.own_vectors and vector is None:
            raise refused(
                "query_embedding",
                "this store's collection takes the client's own vectors: the query "
                "needs its embedding",
            )
        if query.query_str is None and not self.own_vectors:
            raise refused(
                "query_str",
                "normcal embeds queries itself: give the query's text; a query "
                "embedding alone cannot be searched",
            )
        if query.node_ids:  # as_retriever passes [] for a store that keeps the text
            raise NotImplementedError("normcal's search cannot be limited to node_ids")
        documents = (
            {REF_DOC_ID: {"$in": query.doc_ids}} if query.doc_ids is not None else None
        )
        options = {
            "mode": self._mode(query.mode),
            **kwargs,
            "k": query.similarity_top_k,
            "filter": _both(to_filter(query.filters), documents),
            "include_text": True,
        }
        if vector is not None:
            options["vector"] = vector
        return query.query_str, options

    def _mode(self, mode: VectorStoreQueryMode) -> SearchMode:
        if mode == VectorStoreQueryMode.DEFAULT:
            return self.mode
        if mode not in _MODES:
            raise NotImplementedError(
                f"normcal has no {mode.value!r} query mode; it takes default (the"
                " store's mode), hybrid, text_search and sparse (both BM25)"
            )
        return _MODES[mode]

    def _result(self, result: SearchResult) -> VectorStoreQueryResult:
        hits = _best_first(result, self.similarity)
        return VectorStoreQueryResult(
            nodes=[_text_node(hit.id, hit.text or "", hit.metadata) for hit in hits],
            similarities=[_similarity(hit, self.similarity) for hit in hits],
            ids=[hit.id for hit in hits],
        )


def _no_options(kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise refused(sorted(kwargs)[0], "not a delete option of normcal")


def _ids_only(node_ids: list[str], filters: MetadataFilters | None) -> list[str]:
    if filters is not None:
        raise NotImplementedError(
            "normcal deletes by node ids or by filters, not by both at once"
        )
    return node_ids


def _by_ids(node_ids: list[str] | None, filters: MetadataFilters | None) -> list[str]:
    if filters is not None:
        raise NotImplementedError("normcal gets nodes by their ids, not by filters")
    if node_ids is None:
        raise refused("node_ids", "give the node ids to get")
    return node_ids


def _selection(filters: MetadataFilters | None) -> FilterJSON:
    selected = to_filter(filters)
    if selected is None:
        raise refused(
            "filters", "give node ids or filters (clear() deletes everything)"
        )
    return selected


# -- the reranker


class NormcalRerank(Connection, BaseNodePostprocessor):
    """Calibrate any retriever's nodes: a LlamaIndex node postprocessor.

    Over normcal's ``POST /v1/rerank``: the nodes go in the order the retriever
    returned them (that order is evidence), each as its content with its embed
    metadata (``MetadataMode.EMBED``, as LlamaIndex's rerankers send it), its node
    id and its score when every node has one (the retriever's own scale), and come
    back most probable first. Each returned node scores its calibrated probability
    (the cosine when no calibrator serves) and is a copy of the retriever's node
    with ``relevance_score``, ``probability``, ``probability_interval``, ``cosine``,
    ``input_rank``, ``confidence`` and ``calibrator`` added to its metadata, kept out
    of its LLM and embedding content. ``top_n`` keeps the most probable,
    ``min_probability`` drops the rest, and when the service abstains nothing is
    returned unless ``honour_abstain`` is False.
    """

    collection: str | None = None
    """Calibrate with this collection's calibrator (it may hold no documents: a
    namespace fitted from your judged lists); None: the shipped default."""
    top_n: int | None = Field(None, ge=1)
    """Keep at most this many nodes (the most probable); None keeps all."""
    min_probability: float | None = Field(None, ge=0.0, le=1.0)
    """Drop nodes whose calibrated probability is below this."""
    honour_abstain: bool = True
    """Return nothing when the service abstains."""
    base_url: str = DEFAULT_URL
    """Where normcal listens (unused when clients are given)."""
    api_key: str | None = None
    """Bearer token, when the service has ``NORMCAL_API_KEY`` set."""
    timeout: float = 120.0
    """Seconds per request."""
    client: NormcalClient | None = Field(None, exclude=True)
    """A ready sync client (caller-owned)."""
    async_client: AsyncNormcalClient | None = Field(None, exclude=True)
    """A ready async client (caller-owned)."""

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of the component."""
        return "NormcalRerank"

    def _call(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None
    ) -> tuple[str, list[dict[str, Any]]]:
        if query_bundle is None:
            raise ValueError("NormcalRerank needs the query (a query bundle)")
        documents = rerank_documents(
            [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes],
            [n.node.node_id for n in nodes],
            [n.score for n in nodes],
        )
        return query_bundle.query_str, documents

    def _kept(
        self, nodes: list[NodeWithScore], response: RerankResponse
    ) -> list[NodeWithScore]:
        kept = []
        for result in kept_results(
            response,
            min_probability=self.min_probability,
            honour_abstain=self.honour_abstain,
        ):
            node = nodes[result.index].node.model_copy()
            node.metadata = {**node.metadata, **rerank_metadata(result, response)}
            for excluded in (
                "excluded_embed_metadata_keys",
                "excluded_llm_metadata_keys",
            ):
                keys = getattr(node, excluded)
                setattr(
                    node, excluded, [*keys, *(k for k in RERANK_KEYS if k not in keys)]
                )
            kept.append(NodeWithScore(node=node, score=result.relevance_score))
        return kept

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        query, documents = self._call(nodes, query_bundle)
        with self._sync() as client:
            response = client.rerank(
                query, documents, top_n=self.top_n, collection=self.collection
            )
        return self._kept(nodes, response)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        query, documents = self._call(nodes, query_bundle)
        async with self._async() as client:
            response = await client.rerank(
                query, documents, top_n=self.top_n, collection=self.collection
            )
        return self._kept(nodes, response)
