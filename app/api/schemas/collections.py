"""Schemas of the collection resource."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.api.schemas.common import COLLECTION_NAME_PATTERN, ListEnvelope, RequestModel


class CollectionCreate(RequestModel):
    """A new, empty collection."""

    name: str = Field(
        pattern=COLLECTION_NAME_PATTERN, description="becomes a file name"
    )
    description: str = Field("", max_length=1000)


class CalibratorRef(BaseModel):
    """Which calibrator produced the probabilities."""

    id: str
    method: str
    default: bool = Field(description="true when the shipped default profile is in use")
    reorders_hits: bool = Field(
        False, description="probabilities may order hits differently from cosine"
    )


class CollectionInfo(BaseModel):
    """A collection's description.

    A quarantined collection (its file could not be opened at start-up) is listed
    with ``status: "unavailable"``, a ``reason`` and no other fields.
    """

    name: str
    status: Literal["ready", "unavailable"] = "ready"
    reason: str | None = Field(
        None,
        description="why the collection is unavailable; how to recover is in the 503",
    )
    description: str | None = None
    model: str | None = None
    dim: int | None = None
    index_type: str | None = None
    documents: int | None = Field(None, description="documents in SQLite")
    indexed: int | None = Field(
        None, description="vectors in FAISS (equals documents when idle)"
    )
    created_at: float | None = None
    calibrator: CalibratorRef | None = None


class CollectionList(ListEnvelope):
    """All collections."""

    data: list[CollectionInfo]
