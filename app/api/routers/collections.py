"""Collections: create, list, describe, drop."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.schemas.collections import CollectionCreate, CollectionInfo, CollectionList

router = APIRouter(
    prefix="/collections", tags=["collections"], responses=PROBLEM_RESPONSES
)


@router.post("", status_code=status.HTTP_201_CREATED)
def create_collection(*, body: CollectionCreate, service: ServiceDep) -> CollectionInfo:
    """Create an empty collection."""
    return service.collections.create_collection(
        body.name, body.description, body.stemmer, embedding=body.embedding
    )


@router.get("")
def read_collections(*, service: ServiceDep) -> CollectionList:
    """List collections."""
    data = service.collections.list_collections()
    return CollectionList(data=data, count=len(data))


@router.get("/{name}")
def read_collection(*, name: CollectionName, service: ServiceDep) -> CollectionInfo:
    """Describe a collection: counts, model, active calibrator."""
    return service.collections.describe(name)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_collection(*, name: CollectionName, service: ServiceDep) -> Response:
    """Drop a collection and its files."""
    service.collections.drop_collection(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
