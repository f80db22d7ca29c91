"""The server's endpoints, declared once: method, path, request and response model.

Both clients send :class:`Call` objects built from these; the server repository's
contract test walks :data:`ENDPOINTS` against the OpenAPI document, so a route the
client gets wrong, or a server route it lacks, fails there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from normcal_client import _models as m
from normcal_client._options import RetryPolicy

R = TypeVar("R")

JSON = "application/json"


@dataclass(frozen=True)
class Call(Generic[R]):
    """One request ready to send, and how to read its 2xx answer."""

    endpoint: Endpoint[R]
    path: str
    json: dict[str, Any] | None = None
    retry: RetryPolicy | None = None  # None: the client's policy
    content: bytes | None = None  # a body that is not JSON (``endpoint.sends``)

    def parse(self, response: httpx.Response) -> R:
        """The answer as the endpoint's response type."""
        return self.endpoint.parse(response)


@dataclass(frozen=True)
class Endpoint(Generic[R]):
    """One route: ``response`` is a model, ``bytes``, ``str`` or ``type(None)``."""

    method: str
    path: str
    response: type[R]
    request: type[m.RequestModel] | None = None
    accept: str = JSON
    sends: str | None = None  # the media type of a body that is not JSON

    def __call__(self, body: m.RequestModel | None = None, **params: str) -> Call[R]:
        """A :class:`Call` with the path parameters quoted into the template."""
        if (body is None) != (self.request is None) or (
            body is not None and not isinstance(body, self.request or ())
        ):
            raise TypeError(f"{self.method} {self.path} takes {self.request}")
        path = self.path.format(**{k: quote(v, safe="") for k, v in params.items()})
        return Call(self, path, body.body() if body is not None else None)

    def parse(self, response: httpx.Response) -> R:
        """Read a 2xx answer."""
        kind: Any = self.response
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            result: Any = kind.model_validate_json(response.content)
        elif kind is bytes:
            result = response.content
        elif kind is str:
            result = response.text
        else:
            result = None
        return result  # type: ignore[no-any-return]


NoBody = type(None)
_C = "/v1/collections/{name}"
_CAL = _C + "/calibrators/{calibrator_id}"

HEALTH = Endpoint("GET", "/healthz", m.Health)
READY = Endpoint("GET", "/readyz", m.Readiness)
VERSION = Endpoint("GET", "/version", m.VersionInfo)
KEY = Endpoint("GET", "/v1/key", m.KeyInfo)
EMBED = Endpoint("POST", "/v1/embed", m.EmbedResponse, m.EmbedRequest)
EMBEDDINGS = Endpoint(
    "POST", "/v1/embeddings", m.EmbeddingsResponse, m.EmbeddingsRequest
)
LIST_COLLECTIONS = Endpoint("GET", "/v1/collections", m.CollectionList)
CREATE_COLLECTION = Endpoint(
    "POST", "/v1/collections", m.CollectionInfo, m.CollectionCreate
)
GET_COLLECTION = Endpoint("GET", _C, m.CollectionInfo)
DELETE_COLLECTION = Endpoint("DELETE", _C, NoBody)
UPSERT_DOCUMENTS = Endpoint("PUT", _C + "/documents", m.UpsertResponse, m.UpsertRequest)
GET_DOCUMENT = Endpoint("GET", _C + "/documents/{doc_id}", m.DocumentOut)
LIST_DOCUMENTS = Endpoint("GET", _C + "/documents", m.DocumentPage)
QUERY_DOCUMENTS = Endpoint(
    "POST", _C + "/documents/query", m.DocumentPage, m.DocumentsQueryRequest
)
COUNT_DOCUMENTS = Endpoint(
    "POST", _C + "/documents/count", m.DocumentsCount, m.DocumentsCountRequest
)
GET_DOCUMENTS = Endpoint(
    "POST", _C + "/documents/get", m.DocumentsFound, m.DocumentsGetRequest
)
DELETE_DOCUMENTS = Endpoint(
    "POST", _C + "/documents/delete", m.DocumentsDeleted, m.DocumentsDeleteRequest
)
EXPORT_DOCUMENTS = Endpoint(
    "GET", _C + "/documents/export", str, accept="application/x-ndjson"
)
DELETE_DOCUMENT = Endpoint("DELETE", _C + "/documents/{doc_id}", NoBody)
UPDATE_DOCUMENT = Endpoint(
    "PATCH", _C + "/documents/{doc_id}", m.DocumentOut, m.DocumentPatch
)
UPDATE_DOCUMENTS = Endpoint(
    "POST", _C + "/documents/update", m.DocumentsUpdated, m.DocumentsUpdateRequest
)
SEARCH = Endpoint("POST", _C + "/search", m.SearchResult, m.SearchRequest)
SEARCH_BATCH = Endpoint("POST", _C + "/search", m.BatchSearchResponse, m.SearchRequest)
RERANK = Endpoint("POST", "/v1/rerank", m.RerankResponse, m.RerankRequest)
FIT_CALIBRATOR = Endpoint("POST", _C + "/calibrators", m.CalibratorInfo, m.FitRequest)
LIST_CALIBRATORS = Endpoint("GET", _C + "/calibrators", m.CalibratorList)
START_FIT_JOB = Endpoint("POST", _C + "/fit-jobs", m.FitJob, m.FitRequest)
LIST_FIT_JOBS = Endpoint("GET", _C + "/fit-jobs", m.FitJobList)
GET_FIT_JOB = Endpoint("GET", _C + "/fit-jobs/{job_id}", m.FitJob)
GET_CALIBRATOR = Endpoint("GET", _CAL, m.CalibratorInfo)
ACTIVATE_CALIBRATOR = Endpoint("POST", _CAL + "/activate", m.CalibratorInfo)
CALIBRATOR_DRIFT = Endpoint("GET", _CAL + "/drift", m.DriftReport)
RELIABILITY_PNG = Endpoint("GET", _CAL + "/reliability.png", bytes, accept="image/png")
CALIBRATOR_REPORT = Endpoint("GET", _CAL + "/report", str, accept="text/html")
DELETE_CALIBRATOR = Endpoint("DELETE", _CAL, NoBody)
EXPORT_CALIBRATOR = Endpoint("GET", _CAL + "/export", m.CalibratorProfile)
IMPORT_CALIBRATOR = Endpoint(
    "POST", _C + "/calibrators/import", m.CalibratorInfo, m.CalibratorImport
)
FEEDBACK = Endpoint("POST", _C + "/feedback", m.FeedbackResponse, m.FeedbackRequest)
LIST_FEEDBACK = Endpoint("GET", _C + "/feedback", m.FeedbackPage)
DELETE_FEEDBACK = Endpoint("DELETE", _C + "/feedback", m.FeedbackDeleted)
GET_QUERY_LOG = Endpoint("GET", _C + "/query-log", m.QueryLogInfo)
SET_QUERY_LOG = Endpoint("PUT", _C + "/query-log", m.QueryLogInfo, m.QueryLogSettings)
ADD_JUDGING_QUERIES = Endpoint(
    "POST", _C + "/judging/queries", m.JudgingQueriesResponse, m.JudgingQueriesRequest
)
NEXT_TO_JUDGE = Endpoint("GET", _C + "/judging/next", m.JudgingNext)
SKIP_QUERY = Endpoint("POST", _C + "/judging/skip", NoBody, m.SkipRequest)
UNSKIP_QUERY = Endpoint("DELETE", _C + "/judging/skip", NoBody)
UNDO_JUDGMENT = Endpoint("DELETE", _C + "/judging/judgment", m.FeedbackDeleted)
JUDGING_SUGGESTIONS = Endpoint("GET", _C + "/judging/suggestions", m.JudgingSuggestions)
_SNAP = _C + "/snapshots/{snapshot_id}"
CREATE_SNAPSHOT = Endpoint("POST", _C + "/snapshots", m.SnapshotInfo)
LIST_SNAPSHOTS = Endpoint("GET", _C + "/snapshots", m.SnapshotList)
DOWNLOAD_SNAPSHOT = Endpoint("GET", _SNAP, bytes, accept="application/vnd.sqlite3")
RESTORE_SNAPSHOT = Endpoint(
    "POST", _SNAP + "/restore", m.CollectionInfo, m.RestoreRequest
)
UPLOAD_SNAPSHOT = Endpoint(
    "POST",
    _C + "/snapshots/upload",
    m.CollectionInfo,
    sends="application/vnd.sqlite3",
)
DELETE_SNAPSHOT = Endpoint("DELETE", _SNAP, NoBody)

ENDPOINTS: tuple[Endpoint[Any], ...] = (
    HEALTH,
    READY,
    VERSION,
    KEY,
    EMBED,
    EMBEDDINGS,
    LIST_COLLECTIONS,
    CREATE_COLLECTION,
    GET_COLLECTION,
    DELETE_COLLECTION,
    UPSERT_DOCUMENTS,
    GET_DOCUMENT,
    DELETE_DOCUMENT,
    LIST_DOCUMENTS,
    QUERY_DOCUMENTS,
    COUNT_DOCUMENTS,
    GET_DOCUMENTS,
    DELETE_DOCUMENTS,
    UPDATE_DOCUMENT,
    UPDATE_DOCUMENTS,
    EXPORT_DOCUMENTS,
    SEARCH,
    SEARCH_BATCH,
    RERANK,
    FIT_CALIBRATOR,
    LIST_CALIBRATORS,
    START_FIT_JOB,
    LIST_FIT_JOBS,
    GET_FIT_JOB,
    GET_CALIBRATOR,
    ACTIVATE_CALIBRATOR,
    CALIBRATOR_DRIFT,
    RELIABILITY_PNG,
    CALIBRATOR_REPORT,
    DELETE_CALIBRATOR,
    EXPORT_CALIBRATOR,
    IMPORT_CALIBRATOR,
    FEEDBACK,
    LIST_FEEDBACK,
    DELETE_FEEDBACK,
    GET_QUERY_LOG,
    SET_QUERY_LOG,
    ADD_JUDGING_QUERIES,
    NEXT_TO_JUDGE,
    SKIP_QUERY,
    UNSKIP_QUERY,
    UNDO_JUDGMENT,
    JUDGING_SUGGESTIONS,
    CREATE_SNAPSHOT,
    LIST_SNAPSHOTS,
    DOWNLOAD_SNAPSHOT,
    RESTORE_SNAPSHOT,
    UPLOAD_SNAPSHOT,
    DELETE_SNAPSHOT,
)
