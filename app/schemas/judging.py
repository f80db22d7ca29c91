"""Schemas of the judging loop: the opt-in query log, the queue, the next query."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.collections import CalibratorRef
from app.schemas.common import ListEnvelope, RequestModel, Text

DEFAULT_QUERY_LOG_RETENTION = 1000


class QueryLogSettings(RequestModel):
    """Whether searches of a collection record their query texts, and how many."""

    enabled: bool = Field(False, description="off by default: nothing is recorded")
    retention: int = Field(
        DEFAULT_QUERY_LOG_RETENTION,
        ge=1,
        description="distinct queries kept, most recently searched first; "
        "at most limits.max_query_log_retention",
    )


class QueryLogInfo(BaseModel):
    """The query log's settings and how many distinct queries it holds."""

    enabled: bool
    retention: int
    entries: int


class JudgingQueriesRequest(RequestModel):
    """Queries to judge, offered before any logged query, in this order."""

    queries: list[Text] = Field(
        min_length=1, description="at most limits.max_judging_queries"
    )


class JudgingQueriesResponse(BaseModel):
    """How many queries were new to the queue (repeats are kept once)."""

    added: int


class SkipRequest(RequestModel):
    """A queued or logged query not to offer again."""

    query: Text


class JudgingSuggestion(BaseModel):
    """A keyword query made of one document's most distinctive words."""

    query: str
    document_id: str = Field(description="the document its words came from")


class JudgingSuggestions(ListEnvelope):
    """Queries to start judging with, drawn from the collection's documents.

    Each is a document's three most distinctive words (tf-idf over a sample of the
    collection), in the document's order; queued and judged queries are left out.
    """

    data: list[JudgingSuggestion]


class JudgingHit(BaseModel):
    """One hit of the query to judge."""

    id: str
    text: str
    score: float = Field(description="cosine similarity")
    probability: float | None = Field(description="current calibrated P(relevant)")


class JudgingProgress(BaseModel):
    """How far judging has come."""

    judged_queries: int = Field(description="distinct queries with stored feedback")
    relevant_queries: int = Field(description="of them, with a relevant judgment")
    target: int = Field(description="judged queries a calibrator fit needs at least")
    remaining: int = Field(description="queries still to judge in the current source")
    skipped: int
    can_fit: bool = Field(
        description="target reached and at least one judgment is relevant"
    )


class JudgingNext(BaseModel):
    """The next query to judge with its top hits (``query`` null when none is left)."""

    query: str | None
    source: Literal["uploaded", "log", "none"]
    truncated: bool = Field(
        False,
        description="the query log kept only the first limits.max_logged_query_chars "
        "characters of this query: the search that logged it was longer",
    )
    confidence: float | None = Field(description="current P(a relevant hit is shown)")
    hits: list[JudgingHit]
    rerank: bool = Field(
        False,
        description="the query is a logged rerank request: the hits are the "
        "documents it was sent with (ids: the caller's, else text:<hash>)",
    )
    calibrator: CalibratorRef | None
    progress: JudgingProgress
