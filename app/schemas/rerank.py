"""Schemas of ``POST /v1/rerank``: a candidate list from any retriever, calibrated.

Shaped like Cohere's rerank (``query``, ``documents``, ``top_n``,
``return_documents``; results with ``index`` and ``relevance_score``), so a client
written for it works unchanged; normcal adds the probability's interval, the
query-level confidence and abstain flag, and which calibrator answered.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from app.schemas.collections import CalibratorRef
from app.schemas.common import (
    COLLECTION_NAME_PATTERN,
    DocumentId,
    MetadataIn,
    RequestModel,
    Text,
)


class RerankDocument(RequestModel):
    """One candidate as the caller's retriever returned it."""

    text: Text = Field(
        description="the passage; at most limits.max_rerank_document_chars"
    )
    id: DocumentId | None = Field(
        None,
        description="the caller's id of the passage, echoed in the result; at most "
        "limits.max_id_chars",
    )
    score: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        None,
        description="the retriever's own score, any scale (only its gaps within the "
        "list are used); give it for every document or for none",
    )
    metadata: MetadataIn | None = Field(
        None, description="kept with the document and returned with return_documents"
    )


def text_as_document(value: Any) -> Any:
    """A bare string is the shorthand of ``{"text": string}`` (Cohere's shape)."""
    if isinstance(value, str):
        return {"text": value}
    if not isinstance(value, dict | BaseModel):
        raise PydanticCustomError(
            "document_type", "a document is a string or an object with a text"
        )
    return value


class RerankRequest(RequestModel):
    """A query and the candidates another retriever returned for it, in its order."""

    query: Text = Field(description="at most limits.max_text_chars")
    documents: list[Annotated[RerankDocument, BeforeValidator(text_as_document)]] = (
        Field(
            min_length=1,
            description="in the order the retriever returned them: each a string or an "
            "object {text, id?, score?, metadata?}; at most "
            "limits.max_rerank_documents, with at most limits.max_rerank_total_chars "
            "characters of text in all",
        )
    )
    top_n: int | None = Field(
        None, ge=1, description="results returned (the most probable); default all"
    )
    collection: str | None = Field(
        None,
        pattern=COLLECTION_NAME_PATTERN,
        description="calibrate with this collection's active calibrator (it may hold "
        "no documents: a calibration namespace) and, when its query log is on, log "
        "the request for judging; absent: the shipped default for external lists",
    )
    return_documents: bool = Field(
        False, description="include each result's document (text, id, metadata)"
    )
    model: str | None = Field(
        None,
        max_length=256,
        description="accepted for Cohere clients and not used: normcal reranks with "
        "the model it serves (the response's model)",
    )


class RerankedDocument(BaseModel):
    """A result's document, as sent (with ``return_documents``)."""

    text: str
    id: str | None = None
    metadata: dict[str, Any] | None = None


class RerankResult(BaseModel):
    """One candidate, with its position in the request and its probability."""

    index: int = Field(description="position of the document in the request")
    id: str | None = Field(None, description="the document's id, when it had one")
    relevance_score: float = Field(
        description="the probability (Cohere's field name); the cosine when no "
        "calibrator serves"
    )
    probability: float | None = Field(description="calibrated P(relevant)")
    probability_interval: tuple[float, float] | None = Field(
        None, description="[lo, hi] of the probability (how far the level may be off)"
    )
    score: float = Field(description="cosine of query and document (normcal's model)")
    document: RerankedDocument | None = Field(
        None, description="the document, with return_documents"
    )


class RerankResponse(BaseModel):
    """The candidates ordered by probability, and the query-level verdict."""

    results: list[RerankResult] = Field(
        description="most probable first (ties in the request's order); top_n of them"
    )
    confidence: float | None = Field(
        None, description="P(at least one relevant among the returned results)"
    )
    confidence_interval: tuple[float, float] | None = Field(
        None, description="[lo, hi] of the confidence"
    )
    abstain: bool | None = Field(
        None, description="true when nothing relevant is likely among the results"
    )
    calibrator: CalibratorRef
    model: str = Field(description="the embedding model that scored the candidates")
