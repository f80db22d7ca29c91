"""Schemas of the snapshot resource."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.schemas.common import ListEnvelope


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
