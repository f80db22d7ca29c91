"""Schemas of the snapshot resource."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from app.schemas.common import COLLECTION_NAME_PATTERN, ListEnvelope, RequestModel


class SnapshotInfo(BaseModel):
    """One snapshot: a consistent copy of a collection's SQLite file."""

    id: str = Field(description="server-made: creation time (UTC) and randomness")
    collection: str
    created_at: float = Field(description="Unix time the snapshot was taken")
    documents: int | None = Field(
        description="documents in the snapshot; null when the file is unreadable"
    )
    bytes: int = Field(description="size of the snapshot file")


class SnapshotList(ListEnvelope):
    """The snapshots of a collection, oldest first."""

    data: list[SnapshotInfo]


class RestoreRequest(RequestModel):
    """``POST .../snapshots/{id}/restore``: in place, or ``into`` a new collection."""

    into: Annotated[str, StringConstraints(pattern=COLLECTION_NAME_PATTERN)] | None = (
        Field(
            None,
            description="a new collection to create from the snapshot (409 if the "
            "name is taken); the snapshot's own collection keeps serving. Absent "
            "(or the collection's own name): replace the collection in place",
        )
    )
