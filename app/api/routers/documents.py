"""Documents of a collection: batch upsert, read one, delete one."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName, DocumentIdParam
from app.api.schemas.documents import DocumentOut, UpsertRequest, UpsertResponse

router = APIRouter(
    prefix="/collections/{name}/documents",
    tags=["documents"],
    responses=PROBLEM_RESPONSES,
)


@router.put("")
async def upsert_documents(
    *, name: CollectionName, body: UpsertRequest, service: ServiceDep
) -> UpsertResponse:
    """Upsert documents by id; the response means they are durable."""
    return await service.upsert(name, body.documents)


@router.get("/{doc_id:path}")
def read_document(
    *, name: CollectionName, doc_id: DocumentIdParam, service: ServiceDep
) -> DocumentOut:
    """Read one document."""
    return service.get_document(name, doc_id)


@router.delete("/{doc_id:path}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_document(
    *, name: CollectionName, doc_id: DocumentIdParam, service: ServiceDep
) -> Response:
    """Delete one document."""
    await service.delete_document(name, doc_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
