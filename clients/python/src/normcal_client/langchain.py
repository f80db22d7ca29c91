"""LangChain integration (``pip install "normcal-client[langchain]"``).

:class:`NormcalRetriever` returns a collection's hits as LangChain documents with
``probability`` (calibrated P(relevant)), ``score`` (cosine) and ``norm`` in their
metadata, and returns nothing when the service abstains.
:class:`NormcalVectorStore` is a LangChain ``VectorStore`` over a collection whose
relevance score is the calibrated probability, the one score of a retriever that
means what LangChain says a relevance score means: a number in [0, 1] where higher
is more likely relevant. Both embed on the server: no embedding model is needed
here, and the ``embedding`` argument LangChain passes to ``from_texts`` is ignored.
:class:`NormcalReranker` is a document compressor over any retriever (a vector
store, BM25, a hosted search API): it calibrates that retriever's documents through
the service's ``/v1/rerank`` and drops, keeps or annotates them by probability.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Self

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict, Field

from normcal_client._async_client import AsyncNormcalClient
from normcal_client._base import DEFAULT_URL
from normcal_client._errors import refused
from normcal_client._integration import (
    Connection,
    best_first,
    by_probability,
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
    "NormcalReranker",
    "NormcalRetriever",
    "NormcalVectorStore",
    "documents_from_result",
]


def documents_from_result(
    result: SearchResult, *, honour_abstain: bool = True
) -> list[Document]:
    """LangChain documents of one result, normcal's numbers in their metadata.

    The metadata is the document's own plus ``id``, ``score``, ``probability``,
    ``norm``, ``n_tokens``, ``rank``, the query's ``confidence`` and the
    ``calibrator`` id; on a name clash normcal's win. The documents come best
    ``probability`` first (``rank`` is that order); with no calibrator, the
    service's order (cosine in dense mode).
    """
    if honour_abstain and result.abstain:
        return []
    hits = by_probability(result)
    return [
        Document(id=hit.id, page_content=hit.text or "", metadata=metadata)
        for hit, metadata in zip(hits, hit_metadata(result, hits), strict=True)
    ]


class NormcalRetriever(Connection, BaseRetriever):
    """Retrieve from a normcal collection, with calibrated probabilities.

    ``k``, ``mode``, ``candidates``, ``min_probability``, ``target_precision`` and
    ``filter`` are sent with every query and applied by the service; each can be
    overridden per call, e.g. ``retriever.invoke(query, k=1, mode="hybrid")``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    collection: str
    """Name of the normcal collection."""
    base_url: str = DEFAULT_URL
    """Where normcal listens (unused when clients are given)."""
    api_key: str | None = None
    """Bearer token, when the service has ``NORMCAL_API_KEY`` set."""
    k: int = 4
    """Hits to ask for (before probability filters)."""
    mode: SearchMode = "dense"
    """dense (cosine), lexical (BM25) or hybrid (both, ranked by probability)."""
    candidates: int | None = None
    """Depth of the dense and BM25 lists hybrid draws from (server default if None)."""
    min_probability: float | None = Field(None, ge=0.0, le=1.0)
    """Drop hits whose calibrated probability is below this."""
    target_precision: float | None = Field(None, ge=0.0, le=1.0)
    """Keep the longest prefix whose mean probability reaches this."""
    filter: FilterJSON | None = None
    """Metadata filter (equality, or the server's operators: ``$in``, ``$gte``, ...)."""
    honour_abstain: bool = True
    """Return nothing when the service abstains."""
    timeout: float = 120.0
    """Seconds per request."""
    client: NormcalClient | None = None
    """A ready sync client (caller-owned)."""
    async_client: AsyncNormcalClient | None = None
    """A ready async client (caller-owned)."""

    def _search_kwargs(self, overrides: dict[str, Any]) -> dict[str, Any]:
        _no_unknown(overrides, {"k", *_SEARCH_OPTIONS})
        return {
            "k": self.k,
            "mode": self.mode,
            "candidates": self.candidates,
            "filter": self.filter,
            "min_probability": self.min_probability,
            "target_precision": self.target_precision,
            **overrides,
            "include_text": True,
        }

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,  # noqa: ARG002 - LangChain's signature
        **kwargs: Any,
    ) -> list[Document]:
        with self._sync() as client:
            result = client.search(
                self.collection, query, **self._search_kwargs(kwargs)
            )
        return documents_from_result(result, honour_abstain=self.honour_abstain)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,  # noqa: ARG002 - LangChain's signature
        **kwargs: Any,
    ) -> list[Document]:
        async with self._async() as client:
            result = await client.search(
                self.collection, query, **self._search_kwargs(kwargs)
            )
        return documents_from_result(result, honour_abstain=self.honour_abstain)


def _to_langchain(document: DocumentOut) -> Document:
    return Document(
        id=document.id, page_content=document.text, metadata=document.metadata
    )


class NormcalVectorStore(Connection, VectorStore):
    """A LangChain ``VectorStore`` over one normcal collection.

    Documents come back with their own metadata only (LangChain compares them);
    scores travel next to them: ``similarity_search_with_score`` gives the cosine,
    ``similarity_search_with_relevance_scores`` the calibrated probability, with
    ``score_threshold`` applied by the service as ``min_probability``. Similarity
    search returns the top ``k`` whatever the service's abstain decision; use
    :class:`NormcalRetriever` to honour it. ``mode`` ("dense", "lexical" or
    "hybrid") is the search mode of every call unless one passes its own ``mode``.
    """

    def __init__(
        self,
        collection: str,
        *,
        mode: SearchMode = "dense",
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float = 120.0,
        client: NormcalClient | None = None,
        async_client: AsyncNormcalClient | None = None,
    ) -> None:
        self.collection = collection
        self.mode: SearchMode = mode
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.client = client
        self.async_client = async_client

    @property
    def embeddings(self) -> Embeddings | None:
        """None: the service embeds, with the model its collection was made for."""
        return None

    # -- writing
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upsert texts (ids default to random UUIDs); returns their ids."""
        documents = _documents_in(texts, metadatas, ids)
        with self._sync() as client:
            client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upsert texts (ids default to random UUIDs); returns their ids."""
        documents = _documents_in(texts, metadatas, ids)
        async with self._async() as client:
            await client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    def add_embeddings(
        self,
        text_embeddings: Iterable[tuple[str, list[float]]],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upsert ``(text, vector)`` pairs; returns their ids.

        The vectors are your own: the collection was created with ``embedding``.
        """
        documents = _documents_in(*_unzip(text_embeddings, metadatas, ids))
        with self._sync() as client:
            client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    async def aadd_embeddings(
        self,
        text_embeddings: Iterable[tuple[str, list[float]]],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upsert ``(text, vector)`` pairs (see :meth:`add_embeddings`)."""
        documents = _documents_in(*_unzip(text_embeddings, metadatas, ids))
        async with self._async() as client:
            await client.upsert_documents(self.collection, documents, **kwargs)
        return [d.id for d in documents]

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id; unknown ids are no error."""
        with self._sync() as client:
            client.delete_documents(self.collection, _ids(ids, kwargs), missing_ok=True)
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id; unknown ids are no error."""
        async with self._async() as client:
            await client.delete_documents(
                self.collection, _ids(ids, kwargs), missing_ok=True
            )
        return True

    # -- reading
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents among ``ids`` (unknown ids are skipped)."""
        with self._sync() as client:
            found = client.get_documents(self.collection, ids)
        return [_to_langchain(d) for d in found]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents among ``ids`` (unknown ids are skipped)."""
        async with self._async() as client:
            found = await client.get_documents(self.collection, ids)
        return [_to_langchain(d) for d in found]

    def similarity_search(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents most similar to ``query``, in the mode's own order."""
        with self._sync() as client:
            result = client.search(
                self.collection, query, **_search(k, self.mode, kwargs)
            )
        return [doc for doc, _ in _pairs(result)]

    async def asimilarity_search(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents most similar to ``query``, in the mode's own order."""
        async with self._async() as client:
            result = await client.search(
                self.collection, query, **_search(k, self.mode, kwargs)
            )
        return [doc for doc, _ in _pairs(result)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their cosine similarity to ``query``, best first."""
        with self._sync() as client:
            result = client.search(
                self.collection, query, **_search(k, self.mode, kwargs)
            )
        return _with_cosines(result)

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their cosine similarity to ``query``, best first."""
        async with self._async() as client:
            result = await client.search(
                self.collection, query, **_search(k, self.mode, kwargs)
            )
        return _with_cosines(result)

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest your own ``embedding``.

        The collection was created with ``embedding``; ``query=`` text beside the
        vector feeds BM25 and the probabilities.
        """
        text = kwargs.pop("query", None)
        with self._sync() as client:
            result = client.search(
                self.collection, text, vector=embedding, **_search(k, self.mode, kwargs)
            )
        return [doc for doc, _ in _pairs(result)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` documents nearest ``embedding`` (see :meth:`similarity_search_by_vector`)."""
        text = kwargs.pop("query", None)
        async with self._async() as client:
            result = await client.search(
                self.collection, text, vector=embedding, **_search(k, self.mode, kwargs)
            )
        return [doc for doc, _ in _pairs(result)]

    def similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their calibrated P(relevant); ``score_threshold`` filters."""
        with self._sync() as client:
            result = client.search(
                self.collection, query, **_relevance(k, self.mode, kwargs)
            )
        return _with_probabilities(result)

    async def asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their calibrated P(relevant); ``score_threshold`` filters."""
        async with self._async() as client:
            result = await client.search(
                self.collection, query, **_relevance(k, self.mode, kwargs)
            )
        return _with_probabilities(result)

    def _similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.similarity_search_with_relevance_scores(query, k, **kwargs)

    async def _asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self.asimilarity_search_with_relevance_scores(query, k, **kwargs)

    # -- construction
    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,  # noqa: ARG003 - the service embeds
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection: str = "langchain",
        **kwargs: Any,
    ) -> Self:
        """Create the collection if missing, then add ``texts`` to it.

        ``kwargs`` are those of the constructor (``base_url``, ``api_key``, ...).
        """
        store = cls(collection, **kwargs)
        with store._sync() as client:
            client.create_collection(collection, exist_ok=True)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,  # noqa: ARG003 - the service embeds
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection: str = "langchain",
        **kwargs: Any,
    ) -> Self:
        """Create the collection if missing, then add ``texts`` to it."""
        store = cls(collection, **kwargs)
        async with store._async() as client:
            await client.create_collection(collection, exist_ok=True)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store


def _documents_in(
    texts: Iterable[str],
    metadatas: list[dict[str, Any]] | None,
    ids: Sequence[str | None] | None,
    vectors: Sequence[list[float] | None] | None = None,
) -> list[DocumentIn]:
    texts = list(texts)
    metadatas = metadatas if metadatas is not None else [{} for _ in texts]
    given = list(ids) if ids is not None else [None] * len(texts)
    own = list(vectors) if vectors is not None else [None] * len(texts)
    if not len(texts) == len(metadatas) == len(given) == len(own):
        raise refused("metadatas", "texts, metadatas and ids must have the same length")
    return [
        DocumentIn(
            id=doc_id or str(uuid.uuid4()),
            text=text,
            metadata=metadata,
            **({} if vector is None else {"vector": vector}),
        )
        for text, metadata, doc_id, vector in zip(
            texts, metadatas, given, own, strict=True
        )
    ]


def _unzip(
    text_embeddings: Iterable[tuple[str, list[float]]],
    metadatas: list[dict[str, Any]] | None,
    ids: Sequence[str | None] | None,
) -> tuple[
    list[str],
    list[dict[str, Any]] | None,
    Sequence[str | None] | None,
    list[list[float] | None],
]:
    """``_documents_in``'s arguments from ``(text, vector)`` pairs."""
    pairs = list(text_embeddings)
    return [t for t, _ in pairs], metadatas, ids, [list(v) for _, v in pairs]


def _ids(ids: list[str] | None, kwargs: dict[str, Any]) -> list[str]:
    _no_unknown(kwargs, set())
    if ids is None:
        raise refused("ids", "give the ids to delete (drop the collection to empty it)")
    return ids


_SEARCH_OPTIONS = {
    "mode",
    "candidates",
    "filter",
    "min_probability",
    "target_precision",
}


def _search(k: int, mode: SearchMode, kwargs: dict[str, Any]) -> dict[str, Any]:
    _no_unknown(kwargs, _SEARCH_OPTIONS)
    return {"mode": mode, **kwargs, "k": k, "include_text": True}


def _relevance(k: int, mode: SearchMode, kwargs: dict[str, Any]) -> dict[str, Any]:
    threshold = kwargs.pop("score_threshold", None)
    if threshold is not None:
        kwargs["min_probability"] = threshold
    return _search(k, mode, kwargs)


def _pairs(
    result: SearchResult, hits: Sequence[SearchHit] | None = None
) -> list[tuple[Document, Any]]:
    """Documents and their hits, in the order of ``hits`` (the service's by default)."""
    if hits is None:
        hits = result.hits
    return [
        (Document(id=hit.id, page_content=hit.text or "", metadata=hit.metadata), hit)
        for hit in hits
    ]


def _with_cosines(result: SearchResult) -> list[tuple[Document, float]]:
    """Documents and their cosines, the most similar first (whatever the mode)."""
    by_cosine = best_first(result.hits, lambda hit: hit.score)
    return [(doc, hit.score) for doc, hit in _pairs(result, by_cosine)]


def _with_probabilities(result: SearchResult) -> list[tuple[Document, float]]:
    """Documents and their probabilities, the most probable first."""
    if any(hit.probability is None for hit in result.hits):
        raise ValueError(
            "no calibrator applies to this collection, so there is no relevance"
            " score; fit one, or use similarity_search_with_score for cosines"
        )
    return [
        (doc, float(hit.probability or 0.0))
        for doc, hit in _pairs(result, by_probability(result))
    ]


def _no_unknown(options: dict[str, Any], known: set[str]) -> None:
    """Refuse an option normcal does not take, naming it and those it takes."""
    unknown = sorted(set(options) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise refused(unknown[0], f"not an option of normcal here (it takes: {takes})")


class NormcalReranker(Connection, BaseDocumentCompressor):
    """Calibrate any retriever's documents: drop, keep or annotate by probability.

    A LangChain document compressor (``ContextualCompressionRetriever(
    base_compressor=NormcalReranker(), base_retriever=...)``) over normcal's
    ``POST /v1/rerank``: the documents go in the order the base retriever returned
    them (that order is evidence), with its scores when ``score_key`` names the
    metadata key holding them, and come back most probable first. Each keeps its
    own metadata plus ``relevance_score`` and ``probability`` (calibrated
    P(relevant)), ``probability_interval`` ([lo, hi]), ``cosine`` (normcal's model),
    ``input_rank`` (its position in the input), the query's ``confidence`` and the
    ``calibrator`` id; on a name clash normcal's win. ``top_n`` keeps the most
    probable, ``min_probability`` drops the rest, and when the service abstains
    (nothing relevant is likely) nothing is returned unless ``honour_abstain`` is
    False.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    collection: str | None = None
    """Calibrate with this collection's calibrator (it may hold no documents: a
    namespace fitted from your judged lists); None: the shipped default."""
    top_n: int | None = Field(None, ge=1)
    """Keep at most this many documents (the most probable); None keeps all."""
    min_probability: float | None = Field(None, ge=0.0, le=1.0)
    """Drop documents whose calibrated probability is below this."""
    score_key: str | None = None
    """Metadata key of the base retriever's own score, sent with each document
    (used only if every document has a number there)."""
    honour_abstain: bool = True
    """Return nothing when the service abstains."""
    base_url: str = DEFAULT_URL
    """Where normcal listens (unused when clients are given)."""
    api_key: str | None = None
    """Bearer token, when the service has ``NORMCAL_API_KEY`` set."""
    timeout: float = 120.0
    """Seconds per request."""
    client: NormcalClient | None = None
    """A ready sync client (caller-owned)."""
    async_client: AsyncNormcalClient | None = None
    """A ready async client (caller-owned)."""

    def _request(self, documents: Sequence[Document]) -> list[dict[str, Any]]:
        key = self.score_key
        return rerank_documents(
            [d.page_content for d in documents],
            [d.id for d in documents],
            [d.metadata.get(key) if key else None for d in documents],
        )

    def _kept(
        self, documents: Sequence[Document], response: RerankResponse
    ) -> list[Document]:
        return [
            Document(
                id=documents[r.index].id,
                page_content=documents[r.index].page_content,
                metadata={
                    **documents[r.index].metadata,
                    **rerank_metadata(r, response),
                },
            )
            for r in kept_results(
                response,
                min_probability=self.min_probability,
                honour_abstain=self.honour_abstain,
            )
        ]

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,  # noqa: ARG002 - LangChain's signature
    ) -> Sequence[Document]:
        """The documents worth keeping for ``query``, most probable first."""
        if not documents:
            return []
        with self._sync() as client:
            response = client.rerank(
                query,
                self._request(documents),
                top_n=self.top_n,
                collection=self.collection,
            )
        return self._kept(documents, response)

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,  # noqa: ARG002 - LangChain's signature
    ) -> Sequence[Document]:
        """The documents worth keeping for ``query``, most probable first."""
        if not documents:
            return []
        async with self._async() as client:
            response = await client.rerank(
                query,
                self._request(documents),
                top_n=self.top_n,
                collection=self.collection,
            )
        return self._kept(documents, response)
