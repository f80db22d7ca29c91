"""Schemas of ``POST /v1/collections/{name}/search``."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator

from app.schemas.collections import CalibratorRef
from app.schemas.common import (
    FILTER_DESCRIPTION,
    Filter,
    Metadata,
    Probability,
    RequestModel,
    Text,
    Vector,
)

SearchMode = Literal["dense", "lexical", "hybrid"]


class SearchRequest(RequestModel):
    """One query (``query``) or a batch (``queries``)."""

    query: Text | None = None
    queries: list[Text] | None = Field(None, min_length=1)
    vector: Vector | None = Field(
        None,
        description="a query's own embedding (collections created with `embedding`); "
        "`query` beside it is its text, for BM25 and the calibrator",
    )
    vectors: list[Vector] | None = Field(
        None,
        min_length=1,
        description="a batch of `vector`; `queries` beside it are their texts",
    )
    k: int | None = Field(
        None, ge=1, description="hits per query; default 10, at most limits.max_k"
    )
    mode: SearchMode = Field(
        "dense",
        description="dense: top-k by cosine; lexical: top-k by BM25; hybrid: the "
        "union of both top-`candidates` lists ranked by calibrated probability",
    )
    candidates: int | None = Field(
        None,
        ge=1,
        description="depth of the dense and the BM25 list the candidates come from; "
        "default max(k, 20) capped at limits.max_k; at least k, at most limits.max_k",
    )
    filter: Filter | None = Field(
        None,
        description=FILTER_DESCRIPTION,
    )
    include_text: bool = False
    min_probability: Probability | None = Field(
        None, description="drop hits whose probability is below this"
    )
    target_precision: Probability | None = Field(
        None,
        description="return the longest prefix whose mean probability meets this",
    )

    @model_validator(mode="after")
    def _one_of_query_or_queries(self) -> Self:
        if self.vector is not None or self.vectors is not None:
            return self._texts_beside_vectors()
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' or 'queries'")
        return self

    def _texts_beside_vectors(self) -> Self:
        one = self.vector is not None and self.vectors is None and not self.queries
        batch = self.vectors is not None and self.vector is None and self.query is None
        if not (one or batch):
            raise ValueError(
                "give exactly one of 'vector' (with an optional 'query') or "
                "'vectors' (with optional 'queries')"
            )
        if (
            batch
            and self.queries is not None
            and len(self.queries) != len(self.vectors or [])
        ):
            raise ValueError("'queries' beside 'vectors' needs one text per vector")
        return self

    @property
    def own_vectors(self) -> list[list[float]] | None:
        """The queries' own embeddings, batch or not (None: the server embeds)."""
        if self.vector is not None:
            return [self.vector]
        return self.vectors

    @property
    def texts(self) -> list[str]:
        """The query texts, batch or not."""
        return [self.query] if self.query is not None else list(self.queries or [])


class SearchHit(BaseModel):
    """One hit."""

    id: str
    score: float = Field(description="cosine similarity")
    bm25: float = Field(
        description="BM25 of the hit (0: it has none of the query's terms); SQLite "
        "FTS5's score, higher is better, unbounded, comparable only among one query's "
        "hits: a term in half the documents or more weighs 1e-6, so on a collection "
        "of a few documents a match scores ~1e-6 per term (docs/api.md#search-hits)"
    )
    probability: float | None = Field(description="calibrated P(relevant)")
    probability_interval: tuple[float, float] | None = Field(
        None, description="[lo, hi] of the probability (how far the level may be off)"
    )
    norm: float = Field(description="raw norm of the document embedding")
    n_tokens: int
    metadata: Metadata
    text: str | None = None


class QueryInfo(BaseModel):
    """What the model made of the query."""

    norm: float
    n_tokens: int
    truncated: bool


class SearchResult(BaseModel):
    """Hits of one query, best first, with query-level confidence."""

    query: QueryInfo
    mode: SearchMode
    hits: list[SearchHit]
    confidence: float | None = Field(
        None,
        description="P(at least one relevant hit among the returned); with the "
        "shipped default (day one), the best hit's probability",
    )
    confidence_interval: tuple[float, float] | None = Field(
        None, description="[lo, hi] of the confidence"
    )
    abstain: bool | None = Field(
        None, description="true when nothing relevant is likely to have been found"
    )
    calibrator: CalibratorRef | None = None


class BatchSearchResponse(BaseModel):
    """Results of a ``queries`` batch, in order."""

    results: list[SearchResult]
