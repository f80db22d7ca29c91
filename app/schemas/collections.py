"""Schemas of the collection resource."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import COLLECTION_NAME_PATTERN, ListEnvelope, RequestModel


class OwnEmbedding(RequestModel):
    """A collection whose clients send the vectors: no server-side model embeds it."""

    dimension: int = Field(
        ge=1, description="length of every vector; at most limits.max_dimension"
    )
    model: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"\S",
        description="name of the model that made the vectors (recorded, not checked)",
    )


class CollectionCreate(RequestModel):
    """A new, empty collection."""

    name: str = Field(
        pattern=COLLECTION_NAME_PATTERN, description="becomes a file name"
    )
    description: str = Field("", max_length=1000)
    stemmer: Literal["porter", "none"] = Field(
        "porter",
        description="stemming of the lexical (BM25) index: porter (English) or none",
    )
    embedding: OwnEmbedding | None = Field(
        None,
        description="bring your own vectors: documents and searches then carry "
        "`vector`; absent: the server's model embeds texts",
    )


class Guarantee(BaseModel):
    """The abstain guarantee, certified on this collection's own judgments."""

    target: float = Field(description="tolerated share of answered queries w/o a hit")
    delta: float = Field(description="probability that the guarantee fails")
    n_queries: int = Field(description="judged queries the threshold was certified on")


DriftStatus = Literal["ok", "drifting"]


class NextStep(BaseModel):
    """What to do next for better probabilities, and where."""

    action: Literal["judge"] = Field(
        description="judge: label a few queries' hits, then fit a calibrator"
    )
    url: str = Field(description="the collection's judging page")
    detail: str


class CalibratorRef(BaseModel):
    """Which calibrator produced the probabilities, and how far to trust them.

    ``status``: ``"default"`` (no judgments from this collection: the shipped
    cross-domain prior, with intervals; for a model without a profile of its own the
    model-agnostic one, and ``reason`` says so), ``"fitted"`` (fitted on
    ``n_queries`` judged queries of this collection) or ``"none"`` (no shipped
    profile at all: probabilities are null, ``reason`` says why). ``guarantee`` is set only when
    the abstain threshold was certified on this collection's judgments; otherwise no
    rate is claimed and ``abstain`` is true, with the shipped default (day one), when
    even at the upper end of its level interval the best hit is more likely
    irrelevant than relevant (``confidence`` is then the best hit's probability), and
    with a fitted calibrator only when even the upper end of ``confidence_interval``
    (the confidence itself without one) is below 0.5.
    """

    status: Literal["default", "fitted", "none"]
    id: str | None = None
    method: str | None = None
    default: bool = Field(description="true when the shipped default profile is in use")
    reorders_hits: bool = Field(
        False, description="probabilities may order hits differently from cosine"
    )
    n_queries: int | None = Field(None, description="judged queries of a fitted one")
    guarantee: Guarantee | None = None
    reason: str | None = Field(
        None,
        description="why there is no calibrator, or why the default in use is the "
        "model-agnostic one",
    )
    drift: DriftStatus | None = Field(
        None,
        description="search only: whether the collection's recent queries moved away "
        "from the judged ones (GET .../calibrators/{id}/drift says which features); "
        "null: not known yet (too few queries) or no judged queries to compare with",
    )
    next_step: NextStep | None = Field(
        None,
        description="set until the collection has a fitted calibrator: the judging "
        "page that gets it one",
    )


class CollectionInfo(BaseModel):
    """A collection's description.

    A quarantined collection (its file could not be opened at start-up) is listed
    with ``status: "unavailable"``, a ``reason`` and no other fields; one the storage
    is still loading (Milvus after a restart) with ``status: "loading"`` likewise.
    """

    name: str
    status: Literal["ready", "unavailable", "loading"] = "ready"
    reason: str | None = Field(
        None,
        description="why the collection is unavailable or loading; how to recover "
        "is in the 503",
    )
    description: str | None = None
    model: str | None = None
    model_id: str | None = Field(
        None,
        description="identity of the model files that embedded it (GET /version); "
        "null for collections created before identities were recorded",
    )
    dim: int | None = None
    index_type: str | None = None
    documents: int | None = Field(None, description="documents in SQLite")
    indexed: int | None = Field(
        None, description="vectors in FAISS (equals documents when idle)"
    )
    lexical_indexed: int | None = Field(
        None, description="documents in the BM25 index (equals documents when idle)"
    )
    stemmer: str | None = Field(None, description="stemming of the BM25 index")
    created_at: float | None = None
    calibrator: CalibratorRef | None = None
    embedding: Literal["server", "client"] | None = Field(
        None,
        description="server: the server's model embeds texts; client: documents and "
        "searches bring their own vectors (`model` names the client's model)",
    )


class CollectionList(ListEnvelope):
    """All collections."""

    data: list[CollectionInfo]
