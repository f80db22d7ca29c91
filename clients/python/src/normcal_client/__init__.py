"""Python client of the normcal retrieval-calibration service (httpx + pydantic).

::

    from normcal_client import NormcalClient

    with NormcalClient("http://127.0.0.1:8000") as nc:
        nc.create_collection("kb", exist_ok=True)
        nc.upsert_documents("kb", [{"id": "1", "text": "Aspirin lowers heart risk."}])
        for hit in nc.search("kb", "does aspirin help the heart?", k=3).hits:
            print(hit.id, hit.score, hit.probability)

Every endpoint has one typed method on :class:`NormcalClient` and the same method,
awaitable, on :class:`AsyncNormcalClient`. Problem answers (RFC 9457) are raised as
subclasses of :class:`NormcalError`; 429 and 503 answers and connections that could
not be opened are retried with backoff that honours ``Retry-After``.
"""

from __future__ import annotations

from types import FunctionType as _FunctionType

from normcal_client._async_client import AsyncNormcalClient
from normcal_client._base import DEFAULT_URL
from normcal_client._errors import (
    CollectionUnavailable,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InsufficientStorage,
    InvalidRequest,
    NormcalError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    parse_retry_after,
)
from normcal_client._models import (
    BatchSearchResponse,
    CalibratorImport,
    CalibratorInfo,
    CalibratorList,
    CalibratorProfile,
    CalibratorRef,
    CalibratorSelection,
    CollectionCreate,
    CollectionInfo,
    CollectionList,
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    DocumentsGetRequest,
    DriftReport,
    DriftStatus,
    Embedding,
    EmbeddingInfo,
    EmbedRequest,
    EmbedResponse,
    FeatureDrift,
    FeedbackDeleted,
    FeedbackPage,
    FeedbackRequest,
    FeedbackResponse,
    FitJob,
    FitJobError,
    FitJobList,
    FitJobProgress,
    FitJobStatus,
    FitRequest,
    Guarantee,
    Health,
    JudgingHit,
    JudgingNext,
    JudgingProgress,
    JudgingQueriesRequest,
    JudgingQueriesResponse,
    JudgingSuggestions,
    Judgment,
    MethodMetrics,
    ModelIdentity,
    NextStep,
    OwnEmbedding,
    PositiveRate,
    ProblemDetail,
    QueryInfo,
    QueryLogInfo,
    QueryLogSettings,
    Readiness,
    SearchHit,
    SearchMode,
    SearchRequest,
    SearchResult,
    SelectionRule,
    ShippedProfileInfo,
    SkipRequest,
    SnapshotInfo,
    SnapshotList,
    Stemmer,
    StoredJudgment,
    UnavailableCollection,
    UpsertRequest,
    UpsertResponse,
    VersionInfo,
)
from normcal_client._options import NO_RETRY, RequestOptions, RetryPolicy
from normcal_client._sync_client import NormcalClient
from normcal_client._version import __version__

__all__ = [
    "DEFAULT_URL",
    "NO_RETRY",
    "AsyncNormcalClient",
    "BatchSearchResponse",
    "CalibratorImport",
    "CalibratorInfo",
    "CalibratorList",
    "CalibratorProfile",
    "CalibratorRef",
    "CalibratorSelection",
    "CollectionCreate",
    "CollectionInfo",
    "CollectionList",
    "CollectionUnavailable",
    "Conflict",
    "ConnectionFailed",
    "DocumentIn",
    "DocumentOut",
    "DocumentPage",
    "DocumentsDeleteRequest",
    "DocumentsDeleted",
    "DocumentsFound",
    "DocumentsGetRequest",
    "DriftReport",
    "DriftStatus",
    "EmbedRequest",
    "EmbedResponse",
    "Embedding",
    "EmbeddingInfo",
    "FeatureDrift",
    "FeedbackDeleted",
    "FeedbackPage",
    "FeedbackRequest",
    "FeedbackResponse",
    "FitJob",
    "FitJobError",
    "FitJobList",
    "FitJobProgress",
    "FitJobStatus",
    "FitRequest",
    "Forbidden",
    "Guarantee",
    "Health",
    "InsufficientStorage",
    "InvalidRequest",
    "JudgingHit",
    "JudgingNext",
    "JudgingProgress",
    "JudgingQueriesRequest",
    "JudgingQueriesResponse",
    "JudgingSuggestions",
    "Judgment",
    "MethodMetrics",
    "ModelIdentity",
    "NextStep",
    "NormcalClient",
    "NormcalError",
    "NotFound",
    "Overloaded",
    "OwnEmbedding",
    "PayloadTooLarge",
    "PositiveRate",
    "ProblemDetail",
    "QueryInfo",
    "QueryLogInfo",
    "QueryLogSettings",
    "Readiness",
    "RequestOptions",
    "RetryPolicy",
    "SearchHit",
    "SearchMode",
    "SearchRequest",
    "SearchResult",
    "SelectionRule",
    "ServerError",
    "ServiceUnavailable",
    "ShippedProfileInfo",
    "SkipRequest",
    "SnapshotInfo",
    "SnapshotList",
    "Stemmer",
    "StoredJudgment",
    "Unauthorized",
    "UnavailableCollection",
    "UpsertRequest",
    "UpsertResponse",
    "VersionInfo",
    "__version__",
    "parse_retry_after",
]

# Public objects say they live here, not in the private modules (as httpx does).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type | _FunctionType) and _obj.__module__.startswith(
        "normcal_client._"
    ):
        _obj.__module__ = "normcal_client"
del _name, _obj
