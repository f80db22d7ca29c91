"""Snapshots of a collection: take, list, download, restore, delete.

A snapshot is taken with SQLite's online backup API while writes go on; a restore
replaces the live collection by it, after checking it as a start-up load would.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from fastapi.responses import FileResponse

from app.api.auth import ADMIN
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.collections.snapshots import SNAPSHOT_ID_PATTERN
from app.schemas.collections import CollectionInfo
from app.schemas.snapshots import SnapshotInfo, SnapshotList

SQLITE = "application/vnd.sqlite3"

SnapshotId = Annotated[
    str, Path(pattern=SNAPSHOT_ID_PATTERN, description="snapshot id")
]

router = APIRouter(
    prefix="/collections/{name}/snapshots",
    tags=["snapshots"],
    responses=PROBLEM_RESPONSES,
)


@router.post("", dependencies=[ADMIN], status_code=status.HTTP_201_CREATED)
def create_snapshot(*, name: CollectionName, service: ServiceDep) -> SnapshotInfo:
    """Take a snapshot now; the answer means it is durable on disk."""
    return service.collections.create_snapshot(name)


@router.get("", dependencies=[ADMIN])
def list_snapshots(*, name: CollectionName, service: ServiceDep) -> SnapshotList:
    """The collection's snapshots, oldest first."""
    data = service.collections.list_snapshots(name)
    return SnapshotList(data=data, count=len(data))


@router.get(
    "/{snapshot_id}",
    dependencies=[ADMIN],
    response_class=FileResponse,
    responses={200: {"content": {SQLITE: {"schema": {"type": "string"}}}}},
)
def download_snapshot(
    *, name: CollectionName, snapshot_id: SnapshotId, service: ServiceDep
) -> FileResponse:
    """The snapshot file (SQLite), streamed; ``normcal restore`` installs it."""
    path = service.collections.snapshot_file(name, snapshot_id)
    return FileResponse(
        path, media_type=SQLITE, filename=f"{name}-{snapshot_id}.sqlite3"
    )


@router.post("/{snapshot_id}/restore", dependencies=[ADMIN])
def restore_snapshot(
    *, name: CollectionName, snapshot_id: SnapshotId, service: ServiceDep
) -> CollectionInfo:
    """Replace the collection by the snapshot; describes the restored collection."""
    return service.collections.restore_snapshot(name, snapshot_id)


@router.delete(
    "/{snapshot_id}", dependencies=[ADMIN], status_code=status.HTTP_204_NO_CONTENT
)
def delete_snapshot(
    *, name: CollectionName, snapshot_id: SnapshotId, service: ServiceDep
) -> Response:
    """Delete one snapshot."""
    service.collections.delete_snapshot(name, snapshot_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
