"""Documents of a collection: upsert, list, get, read, update metadata, delete, export.

``GET .../documents/export`` is declared before ``GET .../documents/{doc_id}``, so a
document whose id is ``export`` is read with the batch get (``POST .../get``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import StreamingResponse

from app.api.auth import READ, WRITE
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName, DocumentIdParam
from app.schemas.documents import (
    DocumentOut,
    DocumentPage,
    DocumentPatch,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    DocumentsGetRequest,
    DocumentsUpdated,
    DocumentsUpdateRequest,
    UpsertRequest,
    UpsertResponse,
)

NDJSON = "application/x-ndjson"

router = APIRouter(
    prefix="/collections/{name}/documents",
    tags=["documents"],
    responses=PROBLEM_RESPONSES,
)


class NdjsonResponse(StreamingResponse):
    """A streamed body of one JSON object per line."""

    media_type = NDJSON


@router.put("", dependencies=[WRITE])
async def upsert_documents(
    *, name: CollectionName, body: UpsertRequest, service: ServiceDep
) -> UpsertResponse:
    """Upsert documents by id; the response means they are durable."""
    return await service.documents.upsert(name, body.documents)


@router.get("", dependencies=[READ])
def list_documents(
    *,
    name: CollectionName,
    service: ServiceDep,
    limit: Annotated[
        int | None, Query(ge=1, description="page size (limits.max_page_size)")
    ] = None,
    cursor: Annotated[
        str | None, Query(description="next_cursor of the previous page")
    ] = None,
) -> DocumentPage:
    """A page of documents in write order; follow ``next_cursor`` until null."""
    return service.documents.list_documents(name, limit, cursor)


@router.post("/get", dependencies=[READ])
def get_documents(
    *, name: CollectionName, body: DocumentsGetRequest, service: ServiceDep
) -> DocumentsFound:
    """Several documents by id; the unknown ones are listed in ``missing``."""
    return service.documents.get_documents(name, body.ids)


@router.post("/delete", dependencies=[WRITE])
async def delete_documents(
    *, name: CollectionName, body: DocumentsDeleteRequest, service: ServiceDep
) -> DocumentsDeleted:
    """Delete documents by id, by metadata filter, or all (explicitly); the count."""
    return await service.documents.delete_documents(name, body)


@router.post("/update", dependencies=[WRITE])
async def update_documents(
    *, name: CollectionName, body: DocumentsUpdateRequest, service: ServiceDep
) -> DocumentsUpdated:
    """New metadata for several documents, without re-embedding; all or none."""
    data = await service.documents.update_metadata(
        name, [(u.id, u.metadata) for u in body.updates], body.mode
    )
    return DocumentsUpdated(updated=len(data), data=data)


@router.get(
    "/export",
    dependencies=[READ],
    response_class=NdjsonResponse,
    responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}}}},
)
def export_documents(*, name: CollectionName, service: ServiceDep) -> NdjsonResponse:
    """Every document as JSONL, ``{"id","text","metadata"}`` a line, streamed.

    The file is what ``normcal ingest FILE.jsonl`` reads back.
    """
    return NdjsonResponse(service.documents.export_documents(name))


@router.get("/{doc_id:path}", dependencies=[READ])
def read_document(
    *, name: CollectionName, doc_id: DocumentIdParam, service: ServiceDep
) -> DocumentOut:
    """Read one document."""
    return service.documents.get_document(name, doc_id)


@router.patch("/{doc_id:path}", dependencies=[WRITE])
async def update_document(
    *,
    name: CollectionName,
    doc_id: DocumentIdParam,
    body: DocumentPatch,
    service: ServiceDep,
) -> DocumentOut:
    """New metadata for one document (merge or replace), without re-embedding it."""
    (doc,) = await service.documents.update_metadata(
        name, [(doc_id, body.metadata)], body.mode, field=""
    )
    return doc


@router.delete(
    "/{doc_id:path}", dependencies=[WRITE], status_code=status.HTTP_204_NO_CONTENT
)
async def delete_document(
    *, name: CollectionName, doc_id: DocumentIdParam, service: ServiceDep
) -> Response:
    """Delete one document."""
    await service.documents.delete_document(name, doc_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
