"""Documents of a collection: upsert (embedded here), read, list, update, delete, export."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from app.collections.base import CollectionBackend, NewDocument, StoredDocument
from app.embedding import EmbeddingBatch
from app.exceptions import InvalidRequestError
from app.schemas import filters
from app.schemas.common import Filter, Metadata
from app.schemas.documents import (
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    MetadataMode,
    UpsertResponse,
)
from app.services import limits, own_vectors
from app.services.context import DEFAULT_PAGE_SIZE, Part
from app.services.paging import decode_cursor, encode_cursor
from calibration.profile import Profile

EXPORT_CHUNK = 500  # documents read (and sent) per chunk of an export


class DocumentsService(Part):
    """The documents of a collection."""

    async def upsert(self, name: str, documents: list[DocumentIn]) -> UpsertResponse:
        """Embed and durably write documents; returns once the commit is done."""
        lim = self.settings.limits
        limits.check_count("documents", documents, lim.max_documents_per_upsert)
        ids = [d.id for d in documents]
        for i, doc in enumerate(documents):
            limits.check_value(f"documents.{i}.id", len(doc.id), lim.max_id_chars)
            limits.check_metadata(f"documents.{i}.metadata", doc.metadata, lim)
        limits.check_texts("documents.text", [d.text for d in documents], lim)
        _check_unique(ids, "documents")
        collection = self.registry.get_compatible(name)
        batch = await self._document_batch(collection, documents)
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

    async def _document_batch(
        self, collection: CollectionBackend[Profile], documents: list[DocumentIn]
    ) -> EmbeddingBatch:
        """The documents embedded by the server's model, or their own vectors."""
        fields = [f"documents.{i}.vector" for i in range(len(documents))]
        for field, doc in zip(fields, documents, strict=True):
            own_vectors.check_kind(collection, doc.vector is not None, field)
        texts = [d.text for d in documents]
        if not own_vectors.is_own(collection):
            # Bulk: a search never waits behind an upsert's passes.
            return await self.batcher.embed(texts, "document", priority="bulk")
        counts = await self.pool.run(own_vectors.token_counts, self.embedder, texts)
        return own_vectors.vector_batch(
            fields,
            [d.vector or [] for d in documents],
            int(collection.meta["dim"]),
            counts,
        )

    async def update_metadata(
        self,
        name: str,
        updates: list[tuple[str, Metadata]],
        mode: MetadataMode,
        field: str = "updates",
    ) -> list[DocumentOut]:
        """New metadata for documents, as one write, without embedding anything.

        ``updates`` holds ``(id, metadata)`` pairs; ``field`` names them in errors
        (``""``: the body's ``metadata``). The metadata is checked as sent and, after
        a merge, as it would be stored.
        """
        lim = self.settings.limits
        limits.check_count(field or "metadata", updates, lim.max_documents_per_upsert)
        given: dict[str, tuple[Metadata, str]] = {}  # id -> (metadata, its field)
        for i, (doc_id, metadata) in enumerate(updates):
            at = f"{field}.{i}." if field else ""
            limits.check_value(f"{at}id", len(doc_id), lim.max_id_chars)
            limits.check_metadata(f"{at}metadata", metadata, lim)
            given[doc_id] = (metadata, f"{at}metadata")
        ids = [doc_id for doc_id, _ in updates]
        _check_unique(ids, field)

        def revise(doc_id: str, old: Metadata) -> Metadata:
            new, where = given[doc_id]
            if mode == "replace":
                return new
            merged = merge_metadata(old, new)
            limits.check_metadata(where, merged, lim)
            return merged

        collection = self.registry.get(name)
        docs = await self.pool.run(collection.update_metadata, ids, revise)
        return [_document_out(d) for d in docs]

    def get_document(self, name: str, doc_id: str) -> DocumentOut:
        """Read one document."""
        return _document_out(self.registry.get(name).get(doc_id))

    async def delete_document(self, name: str, doc_id: str) -> None:
        """Delete one document."""
        collection = self.registry.get(name)
        await self.pool.run(collection.delete, doc_id)

    def list_documents(
        self, name: str, limit: int | None, cursor: str | None
    ) -> DocumentPage:
        """A page of documents in write order (see ``DocumentPage``)."""
        size, after = self._paging(limit, cursor)
        # One more than asked tells whether another page follows.
        return _page(self.registry.get(name).page(after, size + 1), size)

    async def query_documents(
        self, name: str, raw: Filter, limit: int | None, cursor: str | None
    ) -> DocumentPage:
        """A page of the documents matching a metadata filter, in write order."""
        where = limits.parse_filter("filter", raw, self.settings.limits)
        size, after = self._paging(limit, cursor)
        collection = self.registry.get(name)
        async with self.filter_turn(name, where):
            found = await self.pool.run(collection.page, after, size + 1, where)
        return _page(found, size)

    async def count_documents(self, name: str, raw: Filter) -> int:
        """How many documents match a metadata filter (``{}``: all of them)."""
        where = limits.parse_filter("filter", raw, self.settings.limits)
        collection = self.registry.get(name)
        async with self.filter_turn(name, where):
            return await self.pool.run(collection.count, where)

    def _paging(self, limit: int | None, cursor: str | None) -> tuple[int, int]:
        """The page size (checked against ``max_page_size``) and the seq to start after."""
        lim = self.settings.limits
        size = limit if limit is not None else min(DEFAULT_PAGE_SIZE, lim.max_page_size)
        limits.check_value("limit", size, lim.max_page_size)
        return size, decode_cursor(cursor) if cursor is not None else 0

    def get_documents(self, name: str, ids: list[str]) -> DocumentsFound:
        """The documents among ``ids`` in request order (once each), and the missing."""
        limits.check_count("ids", ids, self.settings.limits.max_ids_per_get)
        wanted = list(dict.fromkeys(ids))
        found = self.registry.get(name).get_many(wanted)
        data = [_document_out(found[i]) for i in wanted if i in found]
        return DocumentsFound(
            data=data, count=len(data), missing=[i for i in wanted if i not in found]
        )

    async def delete_documents(
        self, name: str, body: DocumentsDeleteRequest
    ) -> DocumentsDeleted:
        """Delete the documents named by ``ids``, matching ``filter``, or all."""
        if [body.ids is not None, bool(body.filter), body.all].count(True) != 1:
            raise InvalidRequestError(
                'give exactly one of "ids", a non-empty "filter", or "all": true '
                "(to delete every document)",
                field="filter",
            )
        where = limits.parse_filter("filter", body.filter, self.settings.limits)
        if body.filter and filters.always(where) is True:
            raise InvalidRequestError(
                "the filter matches every document whatever its metadata: to delete "
                'every document, send "all": true instead',
                field="filter",
            )
        collection = self.registry.get(name)
        if body.ids is not None:
            limits.check_count("ids", body.ids, self.settings.limits.max_ids_per_get)
            deleted = await self.pool.run(collection.delete_ids, body.ids)
        else:
            async with self.filter_turn(name, where):
                deleted = await self.pool.run(collection.delete_where, where)
        return DocumentsDeleted(deleted=deleted)

    def export_documents(self, name: str) -> AsyncIterator[bytes]:
        """The collection as JSONL (``{"id","text","metadata"}`` a line), in chunks.

        The collection is looked up now, so an unknown one is a 404 before the
        response starts; the chunks are then read page by page (each under its own
        read lock, like ``list_documents``), never the whole collection at once.
        """
        return self._export(self.registry.get(name))

    async def _export(
        self, collection: CollectionBackend[Profile]
    ) -> AsyncIterator[bytes]:
        after = 0
        while docs := await self.pool.run(collection.page, after, EXPORT_CHUNK):
            yield "".join(
                json.dumps(
                    {"id": d.id, "text": d.text, "metadata": d.metadata},
                    ensure_ascii=False,
                )
                + "\n"
                for d in docs
            ).encode()
            after = docs[-1].seq


def merge_metadata(old: Metadata, patch: Metadata) -> Metadata:
    """``old`` with ``patch``'s keys set, and those it gives as null removed."""
    merged = {**old, **patch}
    return {k: v for k, v in merged.items() if not (k in patch and v is None)}


def _check_unique(ids: list[str], field: str) -> None:
    """Refuse (422) a batch naming a document twice."""
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InvalidRequestError(
            f"document id {dup!r} appears more than once in the batch", field=field
        )


def _page(docs: list[StoredDocument], size: int) -> DocumentPage:
    """The page of the first ``size`` of ``docs``; one more means another page follows."""
    shown = docs[:size]
    return DocumentPage(
        data=[_document_out(d) for d in shown],
        count=len(shown),
        next_cursor=encode_cursor(shown[-1].seq) if len(docs) > size else None,
    )


def _document_out(doc: StoredDocument) -> DocumentOut:
    """A stored document as the wire shows it."""
    return DocumentOut.model_validate(doc, from_attributes=True)
