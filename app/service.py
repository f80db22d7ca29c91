"""The service's use cases, independent of HTTP: embed, collections, documents, search.

Routers translate HTTP into calls here; the CLI and benchmarks call the same methods
in-process. Every CPU-bound step runs in the bounded pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from app import limits
from app.concurrency import CpuPool
from app.embedding import Embedder, EmbeddingBatch, InputType
from app.exceptions import InvalidRequestError
from app.observability import Metrics
from app.registry import Collection, CollectionRegistry, Hit
from app.schemas.collections import CollectionInfo
from app.schemas.documents import DocumentIn, DocumentOut, UpsertResponse
from app.schemas.search import QueryInfo, SearchHit, SearchRequest, SearchResult
from app.settings import Settings
from app.store import NewDocument

logger = logging.getLogger(__name__)

DEFAULT_K = 10


@dataclass
class Service:
    """Everything a request needs, owned by the app's lifespan."""

    settings: Settings
    embedder: Embedder
    registry: CollectionRegistry
    pool: CpuPool
    # Prometheus metrics of the app; the calibrator fit calls metrics.observe_fit.
    metrics: Metrics | None = None

    # -- embedding --------------------------------------------------------------------
    async def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts after checking the batch and text limits."""
        lim = self.settings.limits
        limits.check_count("texts", texts, lim.max_texts_per_request)
        limits.check_texts("texts", texts, lim)
        return await self.pool.run(self.embedder.embed, texts, input_type)

    # -- collections ------------------------------------------------------------------
    def create_collection(self, name: str, description: str) -> CollectionInfo:
        """Create an empty collection."""
        collection = self.registry.create(
            name, description=description, index_type=self.settings.index_type
        )
        return self.describe(collection.name)

    def describe(self, name: str) -> CollectionInfo:
        """Describe a collection."""
        collection = self.registry.get(name)
        documents, indexed = collection.counts()
        meta = collection.meta
        return CollectionInfo(
            name=name,
            description=str(meta.get("description", "")),
            model=str(meta["model"]),
            dim=int(meta["dim"]),
            index_type=collection.index.kind,
            documents=documents,
            indexed=indexed,
            created_at=float(meta["created_at"]),
        )

    def list_collections(self) -> list[CollectionInfo]:
        """Describe every collection."""
        return [self.describe(name) for name in self.registry.names()]

    def drop_collection(self, name: str) -> None:
        """Delete a collection and its files."""
        self.registry.drop(name)

    # -- documents --------------------------------------------------------------------
    async def upsert(self, name: str, documents: list[DocumentIn]) -> UpsertResponse:
        """Embed and durably write documents; returns once the commit is done."""
        lim = self.settings.limits
        limits.check_count("documents", documents, lim.max_documents_per_upsert)
        ids = [d.id for d in documents]
        for i, doc in enumerate(documents):
            limits.check_value(f"documents.{i}.id", len(doc.id), lim.max_id_chars)
            limits.check_metadata(f"documents.{i}.metadata", doc.metadata, lim)
        limits.check_texts("documents.text", [d.text for d in documents], lim)
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise InvalidRequestError(
                f"document id {dup!r} appears more than once in the batch",
                field="documents",
            )
        collection = self.registry.get_compatible(name)
        batch = await self.pool.run(
            self.embedder.embed, [d.text for d in documents], "document"
        )
        rows = [
            NewDocument(
                id=d.id,
                text=d.text,
                metadata=d.metadata,
                vector=batch.vectors[i],
                norm=float(batch.norms[i]),
                n_tokens=int(batch.n_tokens[i]),
                truncated=bool(batch.truncated[i]),
            )
            for i, d in enumerate(documents)
        ]
        await self.pool.run(collection.upsert, rows)
        return UpsertResponse(
            upserted=len(rows),
            ids=ids,
            truncated=[r.id for r in rows if r.truncated],
        )

    def get_document(self, name: str, doc_id: str) -> DocumentOut:
        """Read one document."""
        doc = self.registry.get(name).get(doc_id)
        return DocumentOut(
            id=doc.id,
            text=doc.text,
            metadata=doc.metadata,
            norm=doc.norm,
            n_tokens=doc.n_tokens,
            truncated=doc.truncated,
        )

    async def delete_document(self, name: str, doc_id: str) -> None:
        """Delete one document."""
        collection = self.registry.get(name)
        await self.pool.run(collection.delete, doc_id)

    # -- search -----------------------------------------------------------------------
    async def search(self, name: str, request: SearchRequest) -> list[SearchResult]:
        """Embed the queries and return each one's top-k hits."""
        lim = self.settings.limits
        texts = request.texts
        k = request.k if request.k is not None else min(DEFAULT_K, lim.max_k)
        limits.check_value("k", k, lim.max_k)
        limits.check_count("queries", texts, lim.max_queries_per_search)
        limits.check_texts("queries" if request.queries else "query", texts, lim)
        collection = self.registry.get_compatible(name)
        batch = await self.pool.run(self.embedder.embed, texts, "query")
        hits = await self.pool.run(collection.search, batch.vectors, k, request.filter)
        return [
            _result(batch, i, row, request.include_text) for i, row in enumerate(hits)
        ]

    def collection(self, name: str) -> Collection:
        """Return a collection (for in-process callers)."""
        return self.registry.get(name)


def _result(
    batch: EmbeddingBatch, i: int, hits: list[Hit], include_text: bool
) -> SearchResult:
    return SearchResult(
        query=QueryInfo(
            norm=float(batch.norms[i]),
            n_tokens=int(batch.n_tokens[i]),
            truncated=bool(np.bool_(batch.truncated[i])),
        ),
        hits=[
            SearchHit(
                id=h.document.id,
                score=h.score,
                probability=None,
                norm=h.document.norm,
                n_tokens=h.document.n_tokens,
                metadata=h.document.metadata,
                text=h.document.text if include_text else None,
            )
            for h in hits
        ],
    )
