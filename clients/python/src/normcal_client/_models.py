"""Wire models: one class per schema component of the server's OpenAPI document.

Each class has the server component's name, fields, types and required-ness; the
server repository's contract test compares them with ``create_app().openapi()`` so
drift fails its CI. Constraints (lengths, ranges, patterns) are left to the server,
which answers a problem the client raises as :class:`~normcal_client.InvalidRequest`.

Request models forbid unknown fields (a typo is an error here, not on the wire), are
strict as the server's are (``"2"`` is not an int, ``1`` not a bool: refused here,
as :class:`~normcal_client.InvalidArgument` naming the field, never sent), and are
sent with only the fields the caller set, so server defaults apply. Response models
keep unknown fields, so a newer server does not break an older client.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# A metadata filter: {"topic": "x"} equality, or the operators of the server's filter
# language ($eq $ne $in $nin $gt $gte $lt $lte $exists $and $or $not); the server
# checks it.
FilterJSON = dict[str, Any]
CalibrationMethod = Literal["auto", "platt", "isotonic", "nt", "nt-list"]
UnknownDocuments = Literal["error", "skip"]
InputType = Literal["query", "document"]
SearchMode = Literal["dense", "lexical", "hybrid"]
Stemmer = Literal["porter", "none"]


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields and other types are refused here.

    A refusal is :class:`~normcal_client.InvalidArgument` (a
    :class:`~normcal_client.NormcalError`) naming the field, not pydantic's error.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            from normcal_client._errors import validation_refused

            raise validation_refused(error) from None

    def body(self) -> dict[str, Any]:
        """The JSON body: only the fields that were set, so server defaults apply."""
        return self.model_dump(mode="json", exclude_unset=True)


class ResponseModel(BaseModel):
    """Base of response bodies: unknown fields are kept, not errors."""

    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- requests


class OwnEmbedding(RequestModel):
    """A collection of the client's own vectors: their ``dimension`` and ``model``."""

    dimension: int
    model: str


class CollectionCreate(RequestModel):
    """``POST /v1/collections``."""

    name: str
    description: str = ""
    stemmer: Stemmer = "porter"
    embedding: OwnEmbedding | None = None


class DocumentIn(RequestModel):
    """A document to upsert; ``vector`` only on a collection of the client's own."""

    id: str
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    vector: list[float] | None = None


class UpsertRequest(RequestModel):
    """``PUT /v1/collections/{name}/documents``: one atomic batch."""

    documents: list[DocumentIn]


class DocumentsQueryRequest(RequestModel):
    """``POST /v1/collections/{name}/documents/query``: a page of a filter's matches."""

    filter: FilterJSON = Field(default_factory=dict)
    limit: int | None = None
    cursor: str | None = None


class DocumentsCountRequest(RequestModel):
    """``POST /v1/collections/{name}/documents/count``."""

    filter: FilterJSON = Field(default_factory=dict)


class RestoreRequest(RequestModel):
    """``POST .../snapshots/{id}/restore``: in place, or ``into`` a new collection."""

    into: str | None = None


class DocumentsGetRequest(RequestModel):
    """``POST /v1/collections/{name}/documents/get``: several documents by id."""

    ids: list[str]


class DocumentsDeleteRequest(RequestModel):
    """``POST /v1/collections/{name}/documents/delete``: ids, a filter, or ``all``."""

    ids: list[str] | None = None
    filter: FilterJSON = Field(default_factory=dict)
    all: bool = False


MetadataMode = Literal["merge", "replace"]


class DocumentPatch(RequestModel):
    """``PATCH /v1/collections/{name}/documents/{id}``: new metadata only."""

    metadata: dict[str, Any]
    mode: MetadataMode = "merge"


class DocumentUpdate(RequestModel):
    """One document's new metadata in a batch update."""

    id: str
    metadata: dict[str, Any]


class DocumentsUpdateRequest(RequestModel):
    """``POST /v1/collections/{name}/documents/update``: all change, or none."""

    updates: list[DocumentUpdate]
    mode: MetadataMode = "merge"


class EmbedRequest(RequestModel):
    """``POST /v1/embed``."""

    texts: list[str]
    input_type: InputType = "document"


class EmbeddingsRequest(RequestModel):
    """``POST /v1/embeddings``: OpenAI's request shape (``input_type`` is normcal's)."""

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    input_type: InputType = "document"


class RerankDocument(RequestModel):
    """One candidate as the caller's retriever returned it (``score``: its own)."""

    text: str
    id: str | None = None
    score: float | None = None
    metadata: dict[str, Any] | None = None


class RerankRequest(RequestModel):
    """``POST /v1/rerank``: a query and another retriever's candidates, in its order.

    Cohere's shape (``model`` is accepted for its clients and not used).
    """

    query: str
    documents: list[RerankDocument]
    top_n: int | None = None
    collection: str | None = None
    return_documents: bool = False
    model: str | None = None


class SearchRequest(RequestModel):
    """``POST /v1/collections/{name}/search``: ``query``/``queries`` or own vectors.

    ``vector`` (``vectors``) on a collection of the client's own vectors, with
    ``query`` (``queries``) optional beside them.
    """

    query: str | None = None
    queries: list[str] | None = None
    vector: list[float] | None = None
    vectors: list[list[float]] | None = None
    k: int | None = None
    mode: SearchMode = "dense"
    candidates: int | None = None
    filter: FilterJSON | None = None
    include_text: bool = False
    min_probability: float | None = None
    target_precision: float | None = None


class Judgment(RequestModel):
    """A relevance label of one (query, document) pair; ``relevance`` > 0 is relevant."""

    query: str
    document_id: str
    relevance: int


class JudgedDocument(RerankDocument):
    """A candidate of a judged list; ``relevance`` absent: not judged."""

    relevance: int | None = None


class JudgedList(RequestModel):
    """A query and another retriever's candidates for it, in its order, judged."""

    query: str
    documents: list[JudgedDocument]


class FitRequest(RequestModel):
    """``POST /v1/collections/{name}/calibrators``."""

    judgments: list[Judgment] = Field(default_factory=list)
    lists: list[JudgedList] = Field(default_factory=list)
    method: CalibrationMethod = "auto"
    k: int | None = None
    abstain_target: float | None = 0.1
    abstain_delta: float = 0.1
    activate: bool = True
    include_feedback: bool = True
    unknown_documents: UnknownDocuments = "error"
    allow_reorder: bool = True
    query_vectors: dict[str, list[float]] | None = None


class FeedbackRequest(RequestModel):
    """``POST /v1/collections/{name}/feedback``."""

    judgments: list[Judgment]


class CalibratorImport(RequestModel):
    """``POST /v1/collections/{name}/calibrators/import``: an exported profile."""

    profile: dict[str, Any]
    activate: bool = False


class QueryLogSettings(RequestModel):
    """``PUT /v1/collections/{name}/query-log``: record searched query texts."""

    enabled: bool = False
    retention: int = Field(1000, ge=1)


class JudgingQueriesRequest(RequestModel):
    """``POST /v1/collections/{name}/judging/queries``: queries to judge first."""

    queries: list[str] = Field(min_length=1)


class SkipRequest(RequestModel):
    """``POST /v1/collections/{name}/judging/skip``."""

    query: str


# --------------------------------------------------------------------------- responses


class Health(ResponseModel):
    """``GET /healthz``."""

    status: str


class UnavailableCollection(ResponseModel):
    """A quarantined collection in the readiness detail."""

    name: str
    reason: str


class EmbeddingInfo(ResponseModel):
    """How the model runs: backend, precision (and why), threads per forward pass."""

    backend: str
    precision: Literal["fp32", "mixed", "bf16"]
    reason: str
    threads: int


class Readiness(ResponseModel):
    """``GET /readyz``: ``ready``, or ``degraded`` when some collections could not open.

    ``collections`` is ``None`` for anonymous callers when the server has an API key.
    """

    status: str
    model: str
    dim: int
    reasons: list[str] = []
    collections: int | None = None
    unavailable: list[UnavailableCollection] | None = None
    loading: list[str] | None = None
    embedding: EmbeddingInfo | None = None


class ModelIdentity(ResponseModel):
    """The serving model: configured name, identity of its files, directory."""

    name: str
    id: str
    path: str


class ShippedProfileInfo(ResponseModel):
    """A calibration profile that ships with the server; applies to ``model_id`` only."""

    name: str
    format: int
    model_id: str | None


class VersionInfo(ResponseModel):
    """``GET /version``: normcal version, serving model, shipped profiles."""

    normcal: str
    model: ModelIdentity
    embedding: EmbeddingInfo
    profiles: list[ShippedProfileInfo]


Role = Literal["read", "judge", "write", "admin"]


class KeyInfo(ResponseModel):
    """``GET /v1/key``: the key's name, role and collections (``None``: all)."""

    auth: bool
    name: str | None
    role: Role
    collections: list[str] | None


class Embedding(ResponseModel):
    """One embedded text: unit vector, raw norm, tokens seen."""

    embedding: list[float]
    norm: float
    n_tokens: int
    truncated: bool


class EmbedResponse(ResponseModel):
    """Embeddings in input order."""

    data: list[Embedding]
    model: str
    dim: int


class EmbeddingsItem(ResponseModel):
    """One text's embedding in OpenAI's shape, with the raw norm."""

    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int
    norm: float
    truncated: bool


class EmbeddingsUsage(ResponseModel):
    """Tokens the model read."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(ResponseModel):
    """``POST /v1/embeddings``: embeddings in input order, OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[EmbeddingsItem]
    model: str
    usage: EmbeddingsUsage


class Guarantee(ResponseModel):
    """The abstain guarantee, certified on this collection's own judgments."""

    target: float
    delta: float
    n_queries: int


class NextStep(ResponseModel):
    """What to do next for better probabilities (``action="judge"``), and where."""

    action: Literal["judge"]
    url: str
    detail: str


DriftStatus = Literal["ok", "drifting"]


class CalibratorRef(ResponseModel):
    """Which calibrator produced the probabilities, and how far to trust them.

    ``status``: ``"default"`` (shipped prior, no judgments from this collection),
    ``"fitted"`` (``n_queries`` judged) or ``"none"`` (no profile for this model;
    ``reason`` says why). ``guarantee`` only when certified on this collection.
    ``next_step`` points at the judging page until the collection has a fit;
    ``drift`` (search only) says whether recent queries moved from the judged ones.
    """

    status: Literal["default", "fitted", "none"]
    id: str | None = None
    method: str | None = None
    default: bool
    reorders_hits: bool = False
    n_queries: int | None = None
    guarantee: Guarantee | None = None
    reason: str | None = None
    drift: DriftStatus | None = None
    next_step: NextStep | None = None


class CollectionInfo(ResponseModel):
    """A collection's description.

    A quarantined collection (its files could not be opened when the server started)
    is listed with ``status="unavailable"``, a ``reason`` and no other fields; one
    still loading (Milvus after a restart) with ``status="loading"`` likewise.
    """

    name: str
    status: Literal["ready", "unavailable", "loading"] = "ready"
    reason: str | None = None
    description: str | None = None
    model: str | None = None
    model_id: str | None = None
    dim: int | None = None
    index_type: str | None = None
    documents: int | None = None
    indexed: int | None = None
    lexical_indexed: int | None = None
    stemmer: str | None = None
    created_at: float | None = None
    calibrator: CalibratorRef | None = None
    embedding: Literal["server", "client"] | None = None


class CollectionList(ResponseModel):
    """All collections."""

    data: list[CollectionInfo]
    count: int


class SnapshotInfo(ResponseModel):
    """A snapshot: a consistent copy of a collection's SQLite file.

    ``documents`` is None when the server cannot read the file (a restore of it is
    refused).
    """

    id: str
    collection: str
    created_at: float
    documents: int | None
    bytes: int


class SnapshotList(ResponseModel):
    """The snapshots of a collection, oldest first."""

    data: list[SnapshotInfo]
    count: int


class UpsertResponse(ResponseModel):
    """Acknowledgement of an upsert: every listed id is durable."""

    upserted: int
    ids: list[str]
    truncated: list[str]


class DocumentOut(ResponseModel):
    """A stored document with its embedding's raw norm."""

    id: str
    text: str
    metadata: dict[str, Any]
    norm: float
    n_tokens: int
    truncated: bool


class DocumentsUpdated(ResponseModel):
    """The documents a batch update changed, as stored now, in request order."""

    updated: int
    data: list[DocumentOut]


class DocumentPage(ResponseModel):
    """One page of a listing; ``next_cursor`` is None on the last page."""

    data: list[DocumentOut]
    count: int
    next_cursor: str | None


class DocumentsFound(ResponseModel):
    """A batch get: the documents found (request order) and the ``missing`` ids."""

    data: list[DocumentOut]
    count: int
    missing: list[str]


class DocumentsCount(ResponseModel):
    """How many documents matched a filter."""

    count: int


class DocumentsDeleted(ResponseModel):
    """How many documents a delete removed."""

    deleted: int


class QueryInfo(ResponseModel):
    """What the model made of the query."""

    norm: float
    n_tokens: int
    truncated: bool


class SearchHit(ResponseModel):
    """One hit; ``probability`` is ``None`` while no calibrator applies."""

    id: str
    score: float
    bm25: float
    probability: float | None
    probability_interval: tuple[float, float] | None = None
    norm: float
    n_tokens: int
    metadata: dict[str, Any]
    text: str | None = None


class SearchResult(ResponseModel):
    """Hits of one query, best first, with query-level confidence."""

    query: QueryInfo
    mode: SearchMode
    hits: list[SearchHit]
    confidence: float | None = None
    confidence_interval: tuple[float, float] | None = None
    abstain: bool | None = None
    calibrator: CalibratorRef | None = None


class RerankedDocument(ResponseModel):
    """A result's document as sent (with ``return_documents``)."""

    text: str
    id: str | None = None
    metadata: dict[str, Any] | None = None


class RerankResult(ResponseModel):
    """One candidate: its position in the request (``index``) and its probability.

    ``relevance_score`` is the probability under Cohere's name (the cosine when no
    calibrator serves, and ``probability`` is then None); ``score`` the cosine.
    """

    index: int
    id: str | None = None
    relevance_score: float
    probability: float | None
    probability_interval: tuple[float, float] | None = None
    score: float
    document: RerankedDocument | None = None


class RerankResponse(ResponseModel):
    """The candidates, most probable first, and the query-level verdict."""

    results: list[RerankResult]
    confidence: float | None = None
    confidence_interval: tuple[float, float] | None = None
    abstain: bool | None = None
    calibrator: CalibratorRef
    model: str


class BatchSearchResponse(ResponseModel):
    """Results of a ``queries`` batch, in order."""

    results: list[SearchResult]


class MethodMetrics(ResponseModel):
    """Grouped cross-validated metrics of one method."""

    nll: float | None
    brier: float | None
    ece: float | None
    auroc: float | None


class SelectionRule(ResponseModel):
    """One rule behind the served method, its outcome and why."""

    rule: Literal["requested", "one-se", "ece-guard", "rank-guard", "recalibration"]
    outcome: str
    detail: str


class CalibratorSelection(ResponseModel):
    """Why the served method was chosen (``recalibrated``: with the final stage)."""

    chosen: str
    recalibrated: bool
    served: MethodMetrics
    ece_noise_floor: float | None
    rules: list[SelectionRule]
    recalibrated_cv: dict[str, MethodMetrics]


class FitJudgments(ResponseModel):
    """What a fit ran on: judgments sent, stored feedback included, those dropped."""

    sent: int
    sent_queries: int
    feedback: int
    feedback_queries: int
    dropped: int
    lists: int = 0
    queries: int


class CalibratorSummary(ResponseModel):
    """A calibrator in a listing; ``get_calibrator`` has its report."""

    id: str
    collection: str | None
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
    # Why its method was chosen; None for the shipped default and older calibrators.
    selection: CalibratorSelection | None = None
    report: dict[str, Any]
    # Judgments the fit that made it left out (unknown_documents="skip"); only set
    # in that fit's answer.
    dropped_judgments: int | None = None
    # What the fit that made it ran on; only set in that fit's answer (and its job).
    judgments: FitJudgments | None = None


class FeatureDrift(ResponseModel):
    """One drift feature: its PSI against the judged queries, and whether it moved."""

    feature: str
    psi: float
    level: Literal["stable", "moderate", "shift"]
    critical: float
    moved: bool


class PositiveRate(ResponseModel):
    """Predicted precision at 1 of served queries against the judged queries' one."""

    predicted: float
    judged: float
    interval: tuple[float, float]
    moved: bool


class DriftReport(ResponseModel):
    """``GET .../calibrators/{id}/drift``: served queries against the judged ones.

    ``status``: ``"ok"``, ``"drifting"`` (``moved`` names what moved),
    ``"insufficient-data"`` (``needed`` more served queries) or ``"no-reference"``
    (``reason`` says why; ``next_step`` for the shipped default).
    """

    collection: str
    calibrator: str
    status: Literal["ok", "drifting", "insufficient-data", "no-reference"]
    reason: str | None = None
    n_queries: int
    min_queries: int
    needed: int | None = None
    window: int
    since: float | None = None
    reference_queries: int | None = None
    moved: list[str] = Field(default_factory=list)
    features: list[FeatureDrift] = Field(default_factory=list)
    positive_rate: PositiveRate | None = None
    next_step: NextStep | None = None


FitJobStatus = Literal["queued", "running", "succeeded", "failed"]


class FitJobProgress(ResponseModel):
    """How far a fit got: ``done`` of ``total`` steps, the current one named."""

    stage: str
    done: int
    total: int
    fraction: float


class FitJobError(ResponseModel):
    """Why a fit job failed: the problem the synchronous fit would have answered."""

    title: str
    detail: str
    status: int


class FitJob(ResponseModel):
    """A calibrator fit running on the server (``start_fit``, ``wait_fit_job``)."""

    id: str
    collection: str
    status: FitJobStatus
    progress: FitJobProgress
    created_at: float
    started_at: float | None
    finished_at: float | None
    calibrator: CalibratorInfo | None
    error: FitJobError | None


class FitJobList(ResponseModel):
    """A collection's fit jobs, newest first."""

    data: list[FitJob]
    count: int


class CalibratorList(ResponseModel):
    """A page of calibrators, oldest first; ``next_cursor`` is None on the last page."""

    data: list[CalibratorSummary]
    count: int
    next_cursor: str | None


class FeedbackResponse(ResponseModel):
    """How many judgments were stored, and how many there are now."""

    stored: int
    total: int


class CalibratorProfile(ResponseModel):
    """A calibrator as portable JSON, for import into a collection of the same model."""

    format: int
    id: str
    model: str
    model_id: str | None = None
    method: str


class StoredJudgment(ResponseModel):
    """One stored feedback judgment."""

    query: str
    document_id: str
    relevance: int
    created_at: float


class FeedbackPage(ResponseModel):
    """A page of stored feedback, oldest first; ``next_cursor`` is None at the end."""

    data: list[StoredJudgment]
    count: int
    next_cursor: str | None


class FeedbackDeleted(ResponseModel):
    """How many judgments were deleted."""

    deleted: int


class ProblemDetail(ResponseModel):
    """An RFC 9457 problem document (every error answer)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
    role: str | None = None


class QueryLogInfo(ResponseModel):
    """The query log's settings and how many distinct queries it holds."""

    enabled: bool
    retention: int
    entries: int


class JudgingQueriesResponse(ResponseModel):
    """How many queries were new to the judging queue."""

    added: int


class JudgingSuggestion(ResponseModel):
    """A keyword query made of one document's most distinctive words."""

    query: str
    document_id: str


class JudgingSuggestions(ResponseModel):
    """``GET …/judging/suggestions``: queries to start judging a new collection."""

    data: list[JudgingSuggestion]
    count: int


class JudgingHit(ResponseModel):
    """One hit of the query to judge."""

    id: str
    text: str
    score: float
    probability: float | None


class JudgingProgress(ResponseModel):
    """How far judging has come; ``can_fit`` once a calibrator can be fitted."""

    judged_queries: int
    relevant_queries: int
    target: int
    remaining: int
    skipped: int
    can_fit: bool


class JudgingNext(ResponseModel):
    """``GET …/judging/next``: the next query to judge (``query`` None when done)."""

    query: str | None
    source: Literal["uploaded", "log", "none"]
    truncated: bool = False  # the query log kept only the query's first characters
    confidence: float | None
    hits: list[JudgingHit]
    rerank: bool = False
    calibrator: CalibratorRef | None
    progress: JudgingProgress
