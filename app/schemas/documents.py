"""Schemas of the document resource: upsert, read, list, get, update, delete, export."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.schemas.common import (
    FILTER_DESCRIPTION,
    DocumentId,
    Filter,
    ListEnvelope,
    Metadata,
    MetadataIn,
    RequestModel,
    Text,
    Vector,
)


class DocumentIn(RequestModel):
    """A document to upsert."""

    id: DocumentId
    text: Text
    metadata: MetadataIn = Field(
        default_factory=dict,
        description="JSON object: finite numbers, 64-bit integers, at most "
        "limits.max_metadata_depth levels deep",
    )
    vector: Vector | None = Field(
        None,
        description="the document's own embedding, raw (its length is stored as "
        "`norm`; a unit vector is fine): required on, and only on, a collection "
        "created with `embedding`",
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


class DocumentPage(ListEnvelope):
    """One page of a collection's documents, oldest write first.

    Pass ``next_cursor`` back as ``cursor`` for the next page; it is null on the last
    page. Listing follows write order (``seq``): a document inserted or replaced
    while paging gets a new position at the end, so it appears there (a replaced one
    possibly a second time); a document present throughout is never skipped.
    """

    data: list[DocumentOut]
    next_cursor: str | None = Field(description="cursor of the next page; null: done")


class DocumentsQueryRequest(RequestModel):
    """A page of the documents whose metadata matches ``filter``, in write order.

    Pass ``next_cursor`` back as ``cursor``, with the same filter, for the next page.
    """

    filter: Filter = Field(
        default_factory=dict,
        description=f"{FILTER_DESCRIPTION}; {{}} or absent: every document",
    )
    limit: int | None = Field(
        None, ge=1, description="page size: default 100, at most limits.max_page_size"
    )
    cursor: str | None = Field(
        None, description="next_cursor of the previous page (send the same filter)"
    )


class DocumentsCountRequest(RequestModel):
    """How many documents match ``filter`` (``{}`` or absent: every document)."""

    filter: Filter = Field(default_factory=dict, description=FILTER_DESCRIPTION)


class DocumentsCount(BaseModel):
    """How many documents matched."""

    count: int


class DocumentsGetRequest(RequestModel):
    """Several documents by id (at most ``limits.max_ids_per_get``)."""

    ids: list[DocumentId] = Field(min_length=1)


class DocumentsFound(ListEnvelope):
    """The documents found, in request order, and the ids that were not."""

    data: list[DocumentOut]
    missing: list[str] = Field(description="requested ids not in the collection")


class DocumentsDeleteRequest(RequestModel):
    """Delete documents: by ``ids``, by a metadata ``filter``, or ``all``.

    Exactly one of the three: an empty filter would delete everything, so that takes
    ``"all": true``, and a forgotten filter is a 422 rather than an emptied
    collection. Unknown ids are no error; ``deleted`` counts the ones that existed.
    """

    ids: list[DocumentId] | None = Field(
        None, min_length=1, description="ids to delete (at most limits.max_ids_per_get)"
    )
    filter: Filter = Field(
        default_factory=dict,
        description=FILTER_DESCRIPTION,
    )
    all: bool = Field(False, description="delete every document (no filter)")


class DocumentsDeleted(BaseModel):
    """How many documents a delete removed."""

    deleted: int


MetadataMode = Literal["merge", "replace"]
MODE_DESCRIPTION = (
    "merge (default): the given keys are set and the others kept, a key given null "
    "is removed (JSON Merge Patch, RFC 7386, at the top level); replace: the "
    "metadata becomes the given object"
)
NOT_PATCHED = (
    "changes metadata only (the vector, norm and BM25 entry stay as they are); "
    "to change a document's text, upsert it with PUT .../documents, which "
    "embeds it again"
)


class _MetadataOnly(RequestModel):
    """Refuses ``text`` and ``vector`` with the reason, not as unknown fields."""

    @model_validator(mode="before")
    @classmethod
    def _metadata_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("text", "vector"):
                if key in data:
                    raise ValueError(
                        f"`{key}` cannot be updated here: this {NOT_PATCHED}"
                    )
        return data


class DocumentPatch(_MetadataOnly):
    """New metadata for one document (``PATCH .../documents/{id}``)."""

    metadata: MetadataIn
    mode: MetadataMode = Field("merge", description=MODE_DESCRIPTION)


class DocumentUpdate(_MetadataOnly):
    """One document's new metadata in a batch update."""

    id: DocumentId
    metadata: MetadataIn


class DocumentsUpdateRequest(RequestModel):
    """New metadata for several documents: all of them change, or none does.

    At most ``limits.max_documents_per_upsert`` updates, each id once; an unknown id
    is a 404 naming it, and nothing changes.
    """

    updates: list[DocumentUpdate] = Field(min_length=1)
    mode: MetadataMode = Field("merge", description=MODE_DESCRIPTION)


class DocumentsUpdated(BaseModel):
    """The documents a batch update changed, as stored now, in request order."""

    updated: int
    data: list[DocumentOut]
