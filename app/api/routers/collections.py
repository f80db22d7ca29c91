"""Collections: create, list, describe, drop."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.auth import ADMIN, READ, KeyDep
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.exceptions import ForbiddenError
from app.schemas.collections import CollectionCreate, CollectionInfo, CollectionList

router = APIRouter(
    prefix="/collections", tags=["collections"], responses=PROBLEM_RESPONSES
)


@router.post("", dependencies=[ADMIN], status_code=status.HTTP_201_CREATED)
def create_collection(
    *, body: CollectionCreate, service: ServiceDep, key: KeyDep
) -> CollectionInfo:
    """Create an empty collection."""
    if not key.sees(body.name):
        raise ForbiddenError(
            f"key {key.name!r} is scoped to other collections; it cannot create "
            f"{body.name!r}"
        )
    return service.collections.create_collection(
        body.name, body.description, body.stemmer, embedding=body.embedding
    )


@router.get("", dependencies=[READ])
def read_collections(*, service: ServiceDep, key: KeyDep) -> CollectionList:
    """List collections (those the key is scoped to, if it is)."""
    data = [c for c in service.collections.list_collections() if key.sees(c.name)]
    return CollectionList(data=data, count=len(data))


@router.get("/{name}", dependencies=[READ])
def read_collection(*, name: CollectionName, service: ServiceDep) -> CollectionInfo:
    """Describe a collection: counts, model, active calibrator."""
    return service.collections.describe(name)


@router.delete("/{name}", dependencies=[ADMIN], status_code=status.HTTP_204_NO_CONTENT)
def delete_collection(*, name: CollectionName, service: ServiceDep) -> Response:
    """Drop a collection and its files."""
    service.collections.drop_collection(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
