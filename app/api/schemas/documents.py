"""Schemas of the document resource."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.api.schemas.common import DocumentId, Metadata, MetadataIn, RequestModel, Text


class DocumentIn(RequestModel):
    """A document to upsert."""

    id: DocumentId
    text: Text
    metadata: MetadataIn = Field(
        default_factory=dict,
        description="JSON object: finite numbers, 64-bit integers, at most "
        "limits.max_metadata_depth levels deep",
    )


class UpsertRequest(RequestModel):
    """A batch upsert: the whole batch commits, or nothing does."""

    documents: list[DocumentIn] = Field(min_length=1)


class UpsertResponse(BaseModel):
    """Acknowledgement: every listed document is durable."""

    upserted: int
    ids: list[str]
    truncated: list[str] = Field(description="ids whose text the model cut")


class DocumentOut(BaseModel):
    """A stored document."""

    id: str
    text: str
    metadata: Metadata
    norm: float
    n_tokens: int
    truncated: bool
