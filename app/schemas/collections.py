"""Schemas of the collection resource."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.registry import COLLECTION_NAME_PATTERN
from app.schemas.common import ListEnvelope, RequestModel


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
    """A collection's description."""

    name: str
    description: str
    model: str
    dim: int
    index_type: str
    documents: int = Field(description="documents in SQLite")
    indexed: int = Field(description="vectors in FAISS (equals documents when idle)")
    created_at: float
    calibrator: CalibratorRef | None = None


class CollectionList(ListEnvelope):
    """All collections."""

    data: list[CollectionInfo]
