"""Schemas of calibrators and feedback."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.schemas.collections import NextStep
from app.schemas.common import DocumentId, ListEnvelope, RequestModel, Text, Vector
from app.schemas.rerank import RerankDocument, text_as_document

# Grades are labels, stored as SQLite integers; int32 is far more than any scale needs.
MAX_RELEVANCE = 2**31 - 1

Method = Literal["auto", "platt", "isotonic", "nt", "nt-list"]
UnknownDocuments = Literal["error", "skip"]


class Judgment(RequestModel):
    """A human relevance label of one (query, document) pair."""

    query: Text
    document_id: DocumentId
    relevance: int = Field(
        ge=0, le=MAX_RELEVANCE, description="graded; > 0 means relevant"
    )


class JudgedDocument(RerankDocument):
    """A candidate of a judged list, as the retriever returned it, maybe judged."""

    relevance: int | None = Field(
        None,
        ge=0,
        le=MAX_RELEVANCE,
        description="graded, > 0 is relevant; absent: not judged (counts as not "
        "relevant, as an unjudged hit does)",
    )


class JudgedList(RequestModel):
    """A query and the candidates another retriever returned for it, judged."""

    query: Text = Field(description="at most limits.max_text_chars")
    documents: list[Annotated[JudgedDocument, BeforeValidator(text_as_document)]] = (
        Field(
            min_length=1,
            description="in the retriever's order (a string is a document with no "
            "judgment); the limits of a rerank request",
        )
    )


class FitRequest(RequestModel):
    """Fit a calibrator from judgments (and stored feedback)."""

    judgments: list[Judgment] = Field(
        default_factory=list,
        description="with the stored feedback included, at most "
        "limits.max_judgments_per_fit",
    )
    lists: list[JudgedList] = Field(
        default_factory=list,
        description="judged candidate lists of another retriever (POST /v1/rerank's "
        "documents with relevance): fitted as the lists they are, to serve the "
        "collection's rerank requests; their documents count toward "
        "limits.max_judgments_per_fit",
    )
    method: Method = Field("auto", description="auto keeps the best grouped-CV NLL")
    k: int | None = Field(
        None, ge=2, description="retrieval depth of the pairs; default 20, <= max_k"
    )
    abstain_target: float | None = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="tolerated share of answered queries with no relevant hit",
    )
    abstain_delta: float = Field(
        0.1, gt=0.0, lt=1.0, description="guarantee fails w.p. δ"
    )
    activate: bool = Field(True, description="serve it right away")
    include_feedback: bool = Field(True, description="also use POSTed feedback")
    unknown_documents: UnknownDocuments = Field(
        "error",
        description="judgments (sent or stored) naming a document the collection does "
        "not hold: error refuses the fit (422); skip leaves them out and the "
        "calibrator's dropped_judgments says how many",
    )
    allow_reorder: bool = Field(
        True,
        description="allow document-side evidence (BM25, document norm and length), "
        "whose probabilities can order a query's hits differently from cosine; "
        "false keeps probabilities monotone in cosine within a query",
    )
    query_vectors: dict[str, Vector] | None = Field(
        None,
        description="collections created with `embedding` only, and required there: "
        "each judged query's own vector by its text (one for every judged query, "
        "sent or stored as feedback; at most limits.max_judgments_per_fit)",
    )


class MethodMetrics(BaseModel):
    """Grouped cross-validated metrics of one method."""

    nll: float | None
    brier: float | None
    ece: float | None
    auroc: float | None


class SelectionRule(BaseModel):
    """One rule behind the served method, its outcome and why."""

    rule: Literal["requested", "one-se", "ece-guard", "rank-guard", "recalibration"] = (
        Field(
            description="requested: a named method served as asked; one-se: the best "
            "held-out NLL against the baseline (the prior fit, else Platt) by the "
            "one-standard-error rule; ece-guard: the served map's held-out ECE against "
            "twice its noise floor; rank-guard: the served map's held-out order of each "
            "query's judged hits (nDCG@10) against RRF of their cosine and BM25 "
            "lists; clearly worse (one standard error), the best-ordering family at "
            "its ECE floor is served; recalibration: whether the final "
            "recalibration stage is served on top of the chosen family"
        )
    )
    outcome: str = Field(
        description='e.g. "kept", "baseline served", "at its floor", "switched", '
        '"applied", "not applied"'
    )
    detail: str = Field(description="why, with the held-out numbers")


class CalibratorSelection(BaseModel):
    """Why the served method was chosen."""

    chosen: str = Field(description="the method served")
    recalibrated: bool = Field(
        description="whether the recalibration stage is served on top of it"
    )
    served: MethodMetrics = Field(
        description="held-out metrics of the served map, the stage included"
    )
    ece_noise_floor: float | None = Field(
        description="ECE a perfectly calibrated map with these probabilities shows"
    )
    rules: list[SelectionRule] = Field(description="in the order applied")
    recalibrated_cv: dict[str, MethodMetrics] = Field(
        description="every method with the recalibration stage (cv: without)"
    )


class FitJudgments(BaseModel):
    """What a fit ran on: the judgments sent, the stored feedback, those left out."""

    sent: int = Field(description="judgments in the request")
    sent_queries: int = Field(description="distinct queries among them")
    feedback: int = Field(
        description="stored feedback judgments included (include_feedback: true), "
        "e.g. from the judging page"
    )
    feedback_queries: int = Field(description="distinct queries among them")
    dropped: int = Field(
        description='left out for naming documents the collection does not hold (unknown_documents: "skip")'
    )
    lists: int = Field(
        0, description="judged candidate lists sent (another retriever's, in order)"
    )
    queries: int = Field(
        description="distinct judged queries the fit ran on, the judged lists "
        "included (a pair judged twice counts once, the stored feedback's grade "
        "winning)"
    )


class CalibratorSummary(BaseModel):
    """A calibrator in a listing; its report is ``GET .../calibrators/{id}``."""

    id: str
    collection: str | None = Field(description="null for the shipped default")
    method: str
    created_at: float
    active: bool
    default: bool


class CalibratorInfo(CalibratorSummary):
    """A fitted calibrator and its report."""

    reorders_hits: bool
    cv: dict[str, MethodMetrics]
    norm_lift: dict[str, Any]
    abstain: dict[str, Any] | None
    selection: CalibratorSelection | None = Field(
        None,
        description="why its method was chosen; null for the shipped default and "
        "calibrators fitted before the reasons were recorded",
    )
    report: dict[str, Any] = Field(description="the whole fit report")
    dropped_judgments: int | None = Field(
        None,
        description="judgments the fit that made it left out for naming unknown "
        'documents (unknown_documents: "skip"); set only in that fit\'s answer',
    )
    judgments: FitJudgments | None = Field(
        None,
        description="what the fit that made it ran on; set only in that fit's answer "
        "(and its fit job)",
    )


class CalibratorList(ListEnvelope):
    """One page of a collection's calibrators, oldest first (the default first).

    Pass ``next_cursor`` back as ``cursor`` for the next page; it is null on the last
    page. The reports are not listed: ``GET .../calibrators/{id}`` has one, and
    ``GET .../calibrators/{id}/export`` the whole profile.
    """

    data: list[CalibratorSummary]
    next_cursor: str | None = Field(description="cursor of the next page; null: done")


class FeedbackRequest(RequestModel):
    """Judgments to keep for the next fit."""

    judgments: list[Judgment] = Field(min_length=1)


class FeedbackResponse(BaseModel):
    """How many judgments were stored, and how many there are now."""

    stored: int
    total: int


class CalibratorProfile(BaseModel):
    """A calibrator as portable JSON (``Profile.to_json``).

    Exported from one collection, it can be imported into another collection of the
    same embedding model.
    """

    model_config = ConfigDict(extra="allow")

    format: int = Field(description="profile format version")
    id: str
    model: str = Field(description="the embedding model it was fitted for")
    model_id: str | None = Field(
        None,
        description="identity of the model files it was fitted on; null: not "
        "recorded (import then checks the model name only)",
    )
    method: str


class CalibratorImport(RequestModel):
    """An exported profile to add to this collection under a new id."""

    profile: dict[str, Any] = Field(
        description="the JSON of GET .../calibrators/{id}/export"
    )
    activate: bool = Field(False, description="serve it right away")


class StoredJudgment(BaseModel):
    """One stored feedback judgment."""

    query: str
    document_id: str
    relevance: int
    created_at: float


class FeedbackPage(ListEnvelope):
    """A page of stored feedback, oldest first.

    Pass ``next_cursor`` back as ``cursor`` for the next page; it is null on the last
    page. A judgment added while paging appears at the end; one present throughout is
    never skipped.
    """

    data: list[StoredJudgment]
    next_cursor: str | None = Field(description="cursor of the next page; null: done")


class FeedbackDeleted(BaseModel):
    """How many judgments were deleted."""

    deleted: int


class FeatureDrift(BaseModel):
    """One feature of the served queries against the judged ones."""

    feature: str = Field(
        description="top_cosine, top_gap (top cosine minus the 5th), query_tokens, "
        "top_lexical (the top hit's BM25 share of a perfect match) or "
        "top_probability"
    )
    psi: float = Field(description="population stability index over the judged bins")
    level: Literal["stable", "moderate", "shift"] = Field(
        description="PSI below 0.1, 0.1 to 0.25, above 0.25"
    )
    critical: float = Field(
        description="the PSI the two sample sizes alone reach by chance (at the "
        "Bonferroni share of a 5% risk); a feature moves above both it and 0.25"
    )
    moved: bool


class PositiveRate(BaseModel):
    """Predicted precision at 1 of the served queries against the judged one."""

    predicted: float = Field(description="mean probability of the served top hits")
    judged: float = Field(
        description="share of judged queries whose top hit was relevant"
    )
    interval: tuple[float, float] = Field(
        description="Wilson interval of the judged share (at the same risk)"
    )
    moved: bool = Field(
        description="predicted is outside the interval and at least 0.1 from judged"
    )


class DriftReport(BaseModel):
    """Whether the queries a calibrator serves still look like those it was judged on.

    ``status``: ``ok`` or ``drifting`` (``moved`` names what moved), ``insufficient-
    data`` (fewer than ``min_queries`` served; ``needed`` more) or ``no-reference``
    (no judged queries to compare with; ``reason`` says why). The served window is
    the last ``window`` queries this process answered with this calibrator since
    ``since``; it is kept in memory and starts afresh on restart.
    """

    collection: str
    calibrator: str
    status: Literal["ok", "drifting", "insufficient-data", "no-reference"]
    reason: str | None = None
    n_queries: int = Field(description="served queries in the window")
    min_queries: int
    needed: int | None = Field(
        None,
        description="served queries still needed for a verdict (null: no-reference, "
        "which no number of queries changes)",
    )
    window: int = Field(description="largest number of served queries compared")
    since: float | None = Field(
        None, description="when this process began the window (epoch seconds)"
    )
    reference_queries: int | None = Field(
        None, description="judged queries the calibrator was fitted on"
    )
    moved: list[str] = Field(default_factory=list)
    features: list[FeatureDrift] = Field(default_factory=list)
    positive_rate: PositiveRate | None = None
    next_step: NextStep | None = None
