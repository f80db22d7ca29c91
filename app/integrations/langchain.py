"""A LangChain retriever backed by a normcal collection (``langchain-core`` only).

::

    from app.integrations.langchain import NormcalRetriever

    retriever = NormcalRetriever(
        collection="kb", base_url="http://normcal:8000", min_probability=0.3
    )
    docs = retriever.invoke("does aspirin prevent heart attacks?")
    for doc in docs:
        print(doc.metadata["probability"], doc.page_content)

Every returned :class:`~langchain_core.documents.Document` has the document's own
metadata plus ``id``, ``score`` (cosine), ``probability`` (calibrated P(relevant), or
``None`` while no calibrator applies), ``norm``, ``n_tokens``, ``rank``, the query's
``confidence`` and the ``calibrator`` id; on a name clash these win over the
document's metadata. When the service abstains (nothing relevant is likely among the
hits) the retriever returns no documents, unless ``honour_abstain=False``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from app.client import (
    DEFAULT_URL,
    AsyncNormcalClient,
    NormcalClient,
    SearchResult,
)

__all__ = ["NormcalRetriever", "documents_from_result"]

NORMCAL_KEYS = (
    "id",
    "score",
    "probability",
    "norm",
    "n_tokens",
    "rank",
    "confidence",
    "calibrator",
)


def documents_from_result(
    result: SearchResult, *, honour_abstain: bool = True
) -> list[Document]:
    """Turn one normcal :class:`SearchResult` into LangChain documents."""
    if honour_abstain and result.abstain:
        return []
    calibrator = result.calibrator.id if result.calibrator is not None else None
    documents = []
    for rank, hit in enumerate(result.hits):
        metadata: dict[str, Any] = dict(hit.metadata)
        metadata.update(
            id=hit.id,
            score=hit.score,
            probability=hit.probability,
            norm=hit.norm,
            n_tokens=hit.n_tokens,
            rank=rank,
            confidence=result.confidence,
            calibrator=calibrator,
        )
        documents.append(
            Document(id=hit.id, page_content=hit.text or "", metadata=metadata)
        )
    return documents


class NormcalRetriever(BaseRetriever):
    """Retrieve from a normcal collection, with calibrated probabilities.

    Give either ``base_url`` (and ``api_key``; each query then opens and closes its
    own connection) or ready ``client`` / ``async_client`` objects, which reuse
    connections and which the caller owns and closes. ``k``,
    ``min_probability``, ``target_precision`` and ``filter`` are sent with every
    query and applied by the service.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    collection: str
    """Name of the normcal collection."""
    base_url: str = DEFAULT_URL
    """Where normcal listens (ignored when clients are given)."""
    api_key: str | None = None
    """Bearer token, when the service has ``NORMCAL_API_KEY`` set."""
    k: int = 4
    """Hits to ask for (before probability filters)."""
    min_probability: float | None = Field(None, ge=0.0, le=1.0)
    """Drop hits whose calibrated probability is below this."""
    target_precision: float | None = Field(None, ge=0.0, le=1.0)
    """Keep the longest prefix whose mean probability reaches this."""
    filter: dict[str, str | int | float | bool | None] | None = None
    """Metadata equality filter."""
    honour_abstain: bool = True
    """Return nothing when the service abstains."""
    timeout: float = 120.0
    """Seconds per request."""
    client: NormcalClient | None = None
    """A ready sync client (caller-owned)."""
    async_client: AsyncNormcalClient | None = None
    """A ready async client (caller-owned)."""

    def _search_kwargs(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "filter": self.filter,
            "include_text": True,
            "min_probability": self.min_probability,
            "target_precision": self.target_precision,
        }

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,  # noqa: ARG002 - LangChain signature
    ) -> list[Document]:
        if self.client is not None:
            result = self.client.search(self.collection, query, **self._search_kwargs())
        else:
            # A short-lived client: nothing to close, nothing leaks when the retriever
            # is dropped. Pass ``client=`` to reuse connections across queries.
            with NormcalClient(
                self.base_url, api_key=self.api_key, timeout=self.timeout
            ) as client:
                result = client.search(self.collection, query, **self._search_kwargs())
        return documents_from_result(result, honour_abstain=self.honour_abstain)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,  # noqa: ARG002 - LangChain signature
    ) -> list[Document]:
        if self.async_client is not None:
            result = await self.async_client.search(
                self.collection, query, **self._search_kwargs()
            )
        else:
            # A short-lived client: an AsyncClient is bound to one event loop.
            async with AsyncNormcalClient(
                self.base_url, api_key=self.api_key, timeout=self.timeout
            ) as client:
                result = await client.search(
                    self.collection, query, **self._search_kwargs()
                )
        return documents_from_result(result, honour_abstain=self.honour_abstain)
