"""Python client of the normcal HTTP API (httpx; sync and async).

::

    from app.client import NormcalClient

    with NormcalClient("http://127.0.0.1:8000") as nc:
        nc.create_collection("kb", exist_ok=True)
        nc.upsert_documents("kb", [{"id": "1", "text": "Aspirin lowers heart risk."}])
        result = nc.search("kb", "does aspirin help the heart?", k=3)
        for hit in result.hits:
            print(hit.id, hit.score, hit.probability)

Every endpoint has one typed method on :class:`NormcalClient` and the same method,
awaitable, on :class:`AsyncNormcalClient`. Problem responses (RFC 9457) are raised as
subclasses of :class:`NormcalError`; 429 and 503 answers, and connections that could
not be opened, are retried with exponential backoff that honours ``Retry-After``
(:class:`RetryPolicy`, bounded attempts).

This module imports only httpx and pydantic: a RAG process can use it without loading
torch. Response models accept fields they do not know, so a newer server does not break
an older client.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "DEFAULT_URL",
    "AsyncNormcalClient",
    "BadRequest",
    "CalibratorInfo",
    "CalibratorList",
    "CalibratorRef",
    "CollectionInfo",
    "Conflict",
    "ConnectionFailed",
    "Document",
    "DocumentIn",
    "EmbedResponse",
    "Embedding",
    "Judgment",
    "NormcalClient",
    "NormcalError",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "QueryInfo",
    "RateLimited",
    "Readiness",
    "RetryPolicy",
    "SearchHit",
    "SearchResult",
    "ServerError",
    "Unauthorized",
    "UpsertResponse",
    "ValidationFailed",
]

DEFAULT_URL = "http://127.0.0.1:8000"
PROBLEM_MEDIA_TYPE = "application/problem+json"

# --------------------------------------------------------------------------- errors


class NormcalError(Exception):
    """Base of every error the client raises.

    Attributes
    ----------
    status:
        HTTP status of the answer (``None`` when no answer arrived).
    problem:
        The RFC 9457 problem document as a dict (``type``, ``title``, ``status``,
        ``detail``, ``instance``, sometimes ``errors``); a synthesised one when the
        server answered something else.
    retry_after:
        Seconds from the ``Retry-After`` header, when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        problem: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem: dict[str, Any] = dict(problem or {})
        self.retry_after = retry_after
        self.response = response

    @property
    def type(self) -> str | None:
        """The problem ``type`` URI, e.g. ``/problems/not-found``."""
        value = self.problem.get("type")
        return str(value) if value is not None else None

    @property
    def title(self) -> str | None:
        """The problem ``title``."""
        value = self.problem.get("title")
        return str(value) if value is not None else None

    @property
    def detail(self) -> str | None:
        """The problem ``detail``."""
        value = self.problem.get("detail")
        return str(value) if value is not None else None

    @property
    def instance(self) -> str | None:
        """``urn:request:<id>`` of the failed request (quote it in bug reports)."""
        value = self.problem.get("instance")
        return str(value) if value is not None else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Field errors of a validation problem (empty otherwise)."""
        value = self.problem.get("errors")
        return list(value) if isinstance(value, list) else []


class ConnectionFailed(NormcalError):
    """No HTTP answer: connection refused, DNS failure, timeout, broken stream."""


class BadRequest(NormcalError):
    """400: the body is not valid JSON (or another malformed request)."""


class Unauthorized(NormcalError):
    """401: missing or wrong API key (``NORMCAL_API_KEY`` on the server)."""


class Forbidden(NormcalError):
    """403: the key is valid but not allowed to do this."""


class NotFound(NormcalError):
    """404: unknown collection, document or calibrator."""


class Conflict(NormcalError):
    """409: the resource already exists, or a calibrator is not fitted."""


class PayloadTooLarge(NormcalError):
    """413: the request body is over ``NORMCAL_MAX_BODY_BYTES``."""


class ValidationFailed(NormcalError):
    """422: the request is well-formed but invalid (see :attr:`errors`)."""


class Overloaded(NormcalError):
    """503: the service is saturated or not ready; retried automatically."""


class RateLimited(Overloaded):
    """429: too many requests; retried automatically."""


class ServerError(NormcalError):
    """5xx other than 503: a bug or crash on the server; see its logs."""


_BY_STATUS: dict[int, type[NormcalError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: RateLimited,
    503: Overloaded,
}

RETRY_STATUSES = frozenset({429, 503})


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def error_from_response(response: httpx.Response) -> NormcalError:
    """Turn a non-2xx answer into the matching :class:`NormcalError` subclass."""
    status = response.status_code
    problem: dict[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("title" in body or "detail" in body):
        problem = body
    else:
        text = response.text.strip()
        problem = {
            "type": "about:blank",
            "title": response.reason_phrase or f"HTTP {status}",
            "status": status,
            "detail": text[:500] if text else f"HTTP {status}",
        }
    detail = problem.get("detail") or problem.get("title") or f"HTTP {status}"
    message = f"{status} {problem.get('title', '')}: {detail}".replace(" :", ":")
    if problem.get("instance"):
        message += f" [{problem['instance']}]"
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else NormcalError
    return cls(
        message,
        status=status,
        problem=problem,
        retry_after=parse_retry_after(response.headers.get("retry-after")),
        response=response,
    )


# --------------------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a request again.

    A request is retried when the server answers 429 or 503, or when the connection
    could not be opened (the request never reached the server, so even a POST is
    safe to resend). The wait before retry ``n`` (0-based) is
    ``min(max_backoff, backoff * 2**n)`` with up to ``jitter`` of it added at random;
    a ``Retry-After`` header overrides it (capped at ``max_retry_after``).
    After ``max_attempts`` tries the last error is raised.
    """

    max_attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    jitter: float = 0.1
    retry_statuses: frozenset[int] = field(default=RETRY_STATUSES)
    retry_connect_errors: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0:
            raise ValueError("backoff times must not be negative")

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to sleep after failed attempt ``attempt`` (0-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        base: float = min(self.max_backoff, self.backoff * 2.0**attempt)
        return base * (1.0 + self.jitter * random.random())


NO_RETRY = RetryPolicy(max_attempts=1)

# --------------------------------------------------------------------------- models


class _Model(BaseModel):
    """Response models keep unknown fields: newer servers do not break this client."""

    model_config = ConfigDict(extra="allow")


class Readiness(_Model):
    """``GET /readyz``."""

    status: str
    model: str
    dim: int
    collections: int | None = None  # omitted for anonymous callers of a keyed server


class Embedding(_Model):
    """One embedded text."""

    embedding: list[float]
    norm: float
    n_tokens: int
    truncated: bool


class EmbedResponse(_Model):
    """``POST /v1/embed``."""

    data: list[Embedding]
    model: str
    dim: int


class CalibratorRef(_Model):
    """Which calibrator produced the probabilities."""

    id: str
    method: str
    default: bool = False


class CollectionInfo(_Model):
    """A collection's description (only ``name`` and ``reason`` when unavailable)."""

    name: str
    status: str = "ready"
    reason: str | None = None
    description: str | None = ""
    model: str | None = None
    dim: int | None = None
    index_type: str | None = None
    documents: int | None = None
    indexed: int | None = None
    created_at: float | None = None
    calibrator: CalibratorRef | None = None


class DocumentIn(_Model):
    """A document to upsert (dicts with the same keys are accepted too)."""

    id: str
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class Document(_Model):
    """A stored document."""

    id: str
    text: str
    metadata: dict[str, Any]
    norm: float
    n_tokens: int
    truncated: bool


class UpsertResponse(_Model):
    """Acknowledgement of an upsert: every listed id is durable."""

    upserted: int
    ids: list[str]
    truncated: list[str] = Field(default_factory=list)


class QueryInfo(_Model):
    """What the model made of the query."""

    norm: float
    n_tokens: int
    truncated: bool


class SearchHit(_Model):
    """One hit; ``probability`` is ``None`` while no calibrator applies."""

    id: str
    score: float
    probability: float | None = None
    norm: float
    n_tokens: int
    metadata: dict[str, Any] = Field(default_factory=dict)
    text: str | None = None


class SearchResult(_Model):
    """Hits of one query, best first, with query-level confidence."""

    query: QueryInfo
    hits: list[SearchHit]
    confidence: float | None = None
    abstain: bool | None = None
    calibrator: CalibratorRef | None = None


class Judgment(_Model):
    """A relevance judgment: ``relevance`` > 0 means relevant."""

    query: str
    document_id: str
    relevance: int


class CalibratorInfo(_Model):
    """A fitted calibrator; ``cv``, ``norm_lift`` and the rest are kept as extras."""

    id: str
    method: str


class CalibratorList(_Model):
    """``GET /v1/collections/{c}/calibrators``."""

    data: list[CalibratorInfo]
    count: int


_COLLECTIONS = TypeAdapter(list[CollectionInfo])
_RESULTS = TypeAdapter(list[SearchResult])

M = TypeVar("M")
DocumentLike = DocumentIn | Mapping[str, Any]
JudgmentLike = Judgment | Mapping[str, Any]
CalibrationMethod = Literal["auto", "platt", "isotonic", "nt", "nt-list"]


def _seg(value: str) -> str:
    """Quote one path segment (document ids may hold ``/``, ``?``, spaces)."""
    return quote(value, safe="")


def _dump(items: Iterable[BaseModel | Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        item.model_dump(exclude_none=True)
        if isinstance(item, BaseModel)
        else dict(item)
        for item in items
    ]


def _drop_none(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class _Call(Generic[M]):
    """One API call: what to send and how to read a 2xx answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], M]
    json: Any = None
    params: Mapping[str, Any] | None = None
    accept: str = "application/json"


ModelT = TypeVar("ModelT", bound=BaseModel)


def _json_model(model: type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    def parse(response: httpx.Response) -> ModelT:
        return model.model_validate(response.json())

    return parse


def _none(_: httpx.Response) -> None:
    return None


def _json(r: httpx.Response) -> Any:
    return r.json()


class _Ops:
    """Builds the :class:`_Call` of every endpoint (shared by both clients)."""

    @staticmethod
    def healthz() -> _Call[dict[str, Any]]:
        return _Call("GET", "/healthz", _json)

    @staticmethod
    def readyz() -> _Call[Readiness]:
        return _Call("GET", "/readyz", _json_model(Readiness))

    @staticmethod
    def embed(
        texts: Sequence[str], input_type: Literal["query", "document"]
    ) -> _Call[EmbedResponse]:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not one string")
        body = {"texts": list(texts), "input_type": input_type}
        return _Call("POST", "/v1/embed", _json_model(EmbedResponse), json=body)

    @staticmethod
    def create_collection(name: str, description: str) -> _Call[CollectionInfo]:
        body = {"name": name, "description": description}
        return _Call("POST", "/v1/collections", _json_model(CollectionInfo), json=body)

    @staticmethod
    def list_collections() -> _Call[list[CollectionInfo]]:
        return _Call(
            "GET",
            "/v1/collections",
            lambda r: _COLLECTIONS.validate_python(r.json()["data"]),
        )

    @staticmethod
    def get_collection(name: str) -> _Call[CollectionInfo]:
        return _Call(
            "GET", f"/v1/collections/{_seg(name)}", _json_model(CollectionInfo)
        )

    @staticmethod
    def delete_collection(name: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/collections/{_seg(name)}", _none)

    @staticmethod
    def upsert_documents(
        collection: str, documents: Sequence[DocumentLike]
    ) -> _Call[UpsertResponse]:
        return _Call(
            "PUT",
            f"/v1/collections/{_seg(collection)}/documents",
            _json_model(UpsertResponse),
            json={"documents": _dump(documents)},
        )

    @staticmethod
    def get_document(collection: str, doc_id: str) -> _Call[Document]:
        return _Call(
            "GET",
            f"/v1/collections/{_seg(collection)}/documents/{_seg(doc_id)}",
            _json_model(Document),
        )

    @staticmethod
    def delete_document(collection: str, doc_id: str) -> _Call[None]:
        return _Call(
            "DELETE",
            f"/v1/collections/{_seg(collection)}/documents/{_seg(doc_id)}",
            _none,
        )

    @staticmethod
    def search(collection: str, body: dict[str, Any], batch: bool) -> _Call[Any]:
        def parse(response: httpx.Response) -> Any:
            if batch:
                return _RESULTS.validate_python(response.json()["results"])
            return SearchResult.model_validate(response.json())

        return _Call(
            "POST",
            f"/v1/collections/{_seg(collection)}/search",
            parse,
            json=_drop_none(body),
        )

    @staticmethod
    def fit_calibrator(collection: str, body: dict[str, Any]) -> _Call[CalibratorInfo]:
        return _Call(
            "POST",
            f"/v1/collections/{_seg(collection)}/calibrators",
            _json_model(CalibratorInfo),
            json=body,
        )

    @staticmethod
    def list_calibrators(collection: str) -> _Call[list[CalibratorInfo]]:
        return _Call(
            "GET",
            f"/v1/collections/{_seg(collection)}/calibrators",
            lambda r: CalibratorList.model_validate(r.json()).data,
        )

    @staticmethod
    def get_calibrator(collection: str, calibrator_id: str) -> _Call[CalibratorInfo]:
        return _Call(
            "GET",
            f"/v1/collections/{_seg(collection)}/calibrators/{_seg(calibrator_id)}",
            _json_model(CalibratorInfo),
        )

    @staticmethod
    def activate_calibrator(
        collection: str, calibrator_id: str
    ) -> _Call[CalibratorInfo]:
        return _Call(
            "POST",
            f"/v1/collections/{_seg(collection)}/calibrators/{_seg(calibrator_id)}/activate",
            _json_model(CalibratorInfo),
        )

    @staticmethod
    def reliability_png(collection: str, calibrator_id: str) -> _Call[bytes]:
        return _Call(
            "GET",
            f"/v1/collections/{_seg(collection)}/calibrators/{_seg(calibrator_id)}/reliability.png",
            lambda r: r.content,
            accept="image/png",
        )

    @staticmethod
    def calibrator_report(collection: str, calibrator_id: str) -> _Call[str]:
        return _Call(
            "GET",
            f"/v1/collections/{_seg(collection)}/calibrators/{_seg(calibrator_id)}/report",
            lambda r: r.text,
            accept="text/html",
        )

    @staticmethod
    def feedback(
        collection: str, judgments: Sequence[JudgmentLike]
    ) -> _Call[dict[str, Any]]:
        return _Call(
            "POST",
            f"/v1/collections/{_seg(collection)}/feedback",
            lambda r: r.json() if r.content else {},
            json={"judgments": _dump(judgments)},
        )


def _search_body(
    k: int | None,
    filter: Mapping[str, Any] | None,
    include_text: bool,
    min_probability: float | None,
    target_precision: float | None,
) -> dict[str, Any]:
    return {
        "k": k,
        "filter": dict(filter) if filter is not None else None,
        "include_text": include_text,
        "min_probability": min_probability,
        "target_precision": target_precision,
    }


def _fit_body(
    judgments: Sequence[JudgmentLike],
    method: CalibrationMethod,
    k: int,
    abstain_target: float | None,
    activate: bool,
) -> dict[str, Any]:
    return {
        "judgments": _dump(judgments),
        "method": method,
        "k": k,
        "abstain_target": abstain_target,
        "activate": activate,
    }


def _batches(items: Sequence[M], size: int | None) -> list[Sequence[M]]:
    if size is None or size >= len(items):
        return [items]
    if size < 1:
        raise ValueError("batch_size must be at least 1")
    return [items[i : i + size] for i in range(0, len(items), size)]


def _merge_upserts(parts: list[UpsertResponse]) -> UpsertResponse:
    if len(parts) == 1:
        return parts[0]
    return UpsertResponse(
        upserted=sum(p.upserted for p in parts),
        ids=[i for p in parts for i in p.ids],
        truncated=[i for p in parts for i in p.truncated],
    )


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "normcal-client/0.1"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _env_url() -> str:
    return os.environ.get("NORMCAL_URL") or DEFAULT_URL


def _env_key() -> str | None:
    return os.environ.get("NORMCAL_API_KEY") or None


# --------------------------------------------------------------------------- clients


class _Base:
    def __init__(self, retry: RetryPolicy | None) -> None:
        self.retry = retry or RetryPolicy()

    def _decide(
        self, attempt: int, response: httpx.Response | None, error: Exception | None
    ) -> float | None:
        """Seconds to wait before retrying, or None to stop (raise/return)."""
        if attempt + 1 >= self.retry.max_attempts:
            return None
        if response is not None:
            if response.status_code not in self.retry.retry_statuses:
                return None
            after = parse_retry_after(response.headers.get("retry-after"))
            return self.retry.delay(attempt, after)
        if isinstance(
            error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
        ):
            if self.retry.retry_connect_errors:
                return self.retry.delay(attempt, None)
        return None


def _finish(call: _Call[M], response: httpx.Response) -> M:
    if response.is_success:
        return call.parse(response)
    raise error_from_response(response)


def _transport_error(call: _Call[Any], error: httpx.TransportError) -> ConnectionFailed:
    return ConnectionFailed(
        f"{call.method} {call.path}: {type(error).__name__}: {error}",
        problem={"title": "Connection failed", "detail": str(error)},
    )


class NormcalClient(_Base):
    """Synchronous client.

    Parameters
    ----------
    base_url:
        Where normcal listens, e.g. ``http://normcal:8000`` in compose.
    api_key:
        Bearer token (the server's ``NORMCAL_API_KEY``); ``None`` for no auth.
    timeout:
        Seconds per request (embedding big batches on CPU takes a while).
    retry:
        The :class:`RetryPolicy`; ``RetryPolicy(max_attempts=1)`` disables retries.
    transport:
        An httpx transport (tests: ``httpx.MockTransport``).
    http_client:
        A ready ``httpx.Client`` to use instead (its base URL and headers are kept;
        the caller closes it).
    sleep:
        Called with the seconds to wait between attempts (tests can record them).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(retry)
        self._owns_http = http_client is None
        self.http = http_client or httpx.Client(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )
        if http_client is not None and api_key:
            self.http.headers["Authorization"] = f"Bearer {api_key}"
        self._sleep = sleep

    @classmethod
    def from_env(cls, **kwargs: Any) -> Self:
        """A client for ``$NORMCAL_URL`` (default localhost:8000) and ``$NORMCAL_API_KEY``."""
        kwargs.setdefault("api_key", _env_key())
        return cls(_env_url(), **kwargs)

    def close(self) -> None:
        """Close the connection pool (only when this client created it)."""
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: _Call[M]) -> M:
        attempt = 0
        while True:
            request = self.http.build_request(
                call.method,
                call.path,
                json=call.json,
                params=call.params,
                headers={"Accept": f"{call.accept}, {PROBLEM_MEDIA_TYPE}"},
            )
            try:
                response = self.http.send(request)
            except httpx.TransportError as error:
                wait = self._decide(attempt, None, error)
                if wait is None:
                    raise _transport_error(call, error) from error
            else:
                wait = self._decide(attempt, response, None)
                if wait is None:
                    return _finish(call, response)
                response.close()
            self._sleep(wait)
            attempt += 1

    # -- health
    def healthz(self) -> dict[str, Any]:
        """Liveness."""
        return self._run(_Ops.healthz())

    def readyz(self) -> Readiness:
        """Readiness: model loaded, collections open."""
        return self._run(_Ops.readyz())

    def wait_until_ready(
        self, timeout: float = 120.0, interval: float = 0.5
    ) -> Readiness:
        """Poll ``/readyz`` until it answers 200 (a sidecar may still be loading)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._run_once(_Ops.readyz())
            except (ConnectionFailed, Overloaded, ServerError):
                if time.monotonic() >= deadline:
                    raise
            self._sleep(interval)

    def _run_once(self, call: _Call[M]) -> M:
        saved, self.retry = self.retry, NO_RETRY
        try:
            return self._run(call)
        finally:
            self.retry = saved

    # -- embed
    def embed(
        self,
        texts: Sequence[str],
        input_type: Literal["query", "document"] = "document",
    ) -> EmbedResponse:
        """Unit vectors, raw norms and token counts of ``texts``."""
        return self._run(_Ops.embed(texts, input_type))

    # -- collections
    def create_collection(
        self, name: str, description: str = "", *, exist_ok: bool = False
    ) -> CollectionInfo:
        """Create a collection; with ``exist_ok`` an existing one is returned."""
        try:
            return self._run(_Ops.create_collection(name, description))
        except Conflict:
            if not exist_ok:
                raise
            return self.get_collection(name)

    def list_collections(self) -> list[CollectionInfo]:
        """All collections."""
        return self._run(_Ops.list_collections())

    def get_collection(self, name: str) -> CollectionInfo:
        """One collection's counts, model and active calibrator."""
        return self._run(_Ops.get_collection(name))

    def delete_collection(self, name: str) -> None:
        """Drop a collection and its files."""
        self._run(_Ops.delete_collection(name))

    # -- documents
    def upsert_documents(
        self,
        collection: str,
        documents: Sequence[DocumentLike],
        *,
        batch_size: int | None = None,
    ) -> UpsertResponse:
        """Upsert by id; each request (of ``batch_size`` documents) is atomic."""
        parts = [
            self._run(_Ops.upsert_documents(collection, batch))
            for batch in _batches(list(documents), batch_size)
        ]
        return _merge_upserts(parts)

    def get_document(self, collection: str, doc_id: str) -> Document:
        """One stored document with its norm."""
        return self._run(_Ops.get_document(collection, doc_id))

    def delete_document(self, collection: str, doc_id: str) -> None:
        """Delete one document."""
        self._run(_Ops.delete_document(collection, doc_id))

    # -- search
    def search(
        self,
        collection: str,
        query: str,
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> SearchResult:
        """Top-k hits of one query with scores, norms and probabilities."""
        body = _search_body(k, filter, include_text, min_probability, target_precision)
        body["query"] = query
        result: SearchResult = self._run(_Ops.search(collection, body, batch=False))
        return result

    def search_batch(
        self,
        collection: str,
        queries: Sequence[str],
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> list[SearchResult]:
        """One :class:`SearchResult` per query, in order."""
        body = _search_body(k, filter, include_text, min_probability, target_precision)
        body["queries"] = list(queries)
        results: list[SearchResult] = self._run(
            _Ops.search(collection, body, batch=True)
        )
        return results

    # -- calibrators
    def fit_calibrator(
        self,
        collection: str,
        judgments: Sequence[JudgmentLike],
        *,
        method: CalibrationMethod = "auto",
        k: int = 20,
        abstain_target: float | None = 0.1,
        activate: bool = True,
    ) -> CalibratorInfo:
        """Fit (and by default activate) a calibrator from relevance judgments."""
        body = _fit_body(judgments, method, k, abstain_target, activate)
        return self._run(_Ops.fit_calibrator(collection, body))

    def list_calibrators(self, collection: str) -> list[CalibratorInfo]:
        """Calibrators fitted for a collection."""
        return self._run(_Ops.list_calibrators(collection))

    def get_calibrator(self, collection: str, calibrator_id: str) -> CalibratorInfo:
        """One calibrator with its cross-validation metrics and norm lift."""
        return self._run(_Ops.get_calibrator(collection, calibrator_id))

    def activate_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Make a calibrator the one search uses."""
        return self._run(_Ops.activate_calibrator(collection, calibrator_id))

    def reliability_png(self, collection: str, calibrator_id: str) -> bytes:
        """The reliability diagram (PNG bytes)."""
        return self._run(_Ops.reliability_png(collection, calibrator_id))

    def calibrator_report(self, collection: str, calibrator_id: str) -> str:
        """The HTML report page."""
        return self._run(_Ops.calibrator_report(collection, calibrator_id))

    def feedback(
        self, collection: str, judgments: Sequence[JudgmentLike]
    ) -> dict[str, Any]:
        """Send relevance judgments collected in production."""
        return self._run(_Ops.feedback(collection, judgments))


class AsyncNormcalClient(_Base):
    """Asynchronous client; same methods as :class:`NormcalClient`, awaitable.

    ``transport`` is an ``httpx.AsyncBaseTransport`` (tests: ``httpx.ASGITransport``
    over the app, or ``httpx.MockTransport``); ``http_client`` an
    ``httpx.AsyncClient``; ``sleep`` an async callable.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(retry)
        self._owns_http = http_client is None
        self.http = http_client or httpx.AsyncClient(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )
        if http_client is not None and api_key:
            self.http.headers["Authorization"] = f"Bearer {api_key}"
        self._sleep = sleep

    @classmethod
    def from_env(cls, **kwargs: Any) -> Self:
        """A client for ``$NORMCAL_URL`` (default localhost:8000) and ``$NORMCAL_API_KEY``."""
        kwargs.setdefault("api_key", _env_key())
        return cls(_env_url(), **kwargs)

    async def aclose(self) -> None:
        """Close the connection pool (only when this client created it)."""
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: _Call[M]) -> M:
        attempt = 0
        while True:
            request = self.http.build_request(
                call.method,
                call.path,
                json=call.json,
                params=call.params,
                headers={"Accept": f"{call.accept}, {PROBLEM_MEDIA_TYPE}"},
            )
            try:
                response = await self.http.send(request)
            except httpx.TransportError as error:
                wait = self._decide(attempt, None, error)
                if wait is None:
                    raise _transport_error(call, error) from error
            else:
                wait = self._decide(attempt, response, None)
                if wait is None:
                    return _finish(call, response)
                await response.aclose()
            await self._sleep(wait)
            attempt += 1

    async def _run_once(self, call: _Call[M]) -> M:
        saved, self.retry = self.retry, NO_RETRY
        try:
            return await self._run(call)
        finally:
            self.retry = saved

    # -- health
    async def healthz(self) -> dict[str, Any]:
        """Liveness."""
        return await self._run(_Ops.healthz())

    async def readyz(self) -> Readiness:
        """Readiness: model loaded, collections open."""
        return await self._run(_Ops.readyz())

    async def wait_until_ready(
        self, timeout: float = 120.0, interval: float = 0.5
    ) -> Readiness:
        """Poll ``/readyz`` until it answers 200."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self._run_once(_Ops.readyz())
            except (ConnectionFailed, Overloaded, ServerError):
                if time.monotonic() >= deadline:
                    raise
            await self._sleep(interval)

    # -- embed
    async def embed(
        self,
        texts: Sequence[str],
        input_type: Literal["query", "document"] = "document",
    ) -> EmbedResponse:
        """Unit vectors, raw norms and token counts of ``texts``."""
        return await self._run(_Ops.embed(texts, input_type))

    # -- collections
    async def create_collection(
        self, name: str, description: str = "", *, exist_ok: bool = False
    ) -> CollectionInfo:
        """Create a collection; with ``exist_ok`` an existing one is returned."""
        try:
            return await self._run(_Ops.create_collection(name, description))
        except Conflict:
            if not exist_ok:
                raise
            return await self.get_collection(name)

    async def list_collections(self) -> list[CollectionInfo]:
        """All collections."""
        return await self._run(_Ops.list_collections())

    async def get_collection(self, name: str) -> CollectionInfo:
        """One collection's counts, model and active calibrator."""
        return await self._run(_Ops.get_collection(name))

    async def delete_collection(self, name: str) -> None:
        """Drop a collection and its files."""
        await self._run(_Ops.delete_collection(name))

    # -- documents
    async def upsert_documents(
        self,
        collection: str,
        documents: Sequence[DocumentLike],
        *,
        batch_size: int | None = None,
    ) -> UpsertResponse:
        """Upsert by id; each request (of ``batch_size`` documents) is atomic."""
        parts = [
            await self._run(_Ops.upsert_documents(collection, batch))
            for batch in _batches(list(documents), batch_size)
        ]
        return _merge_upserts(parts)

    async def get_document(self, collection: str, doc_id: str) -> Document:
        """One stored document with its norm."""
        return await self._run(_Ops.get_document(collection, doc_id))

    async def delete_document(self, collection: str, doc_id: str) -> None:
        """Delete one document."""
        await self._run(_Ops.delete_document(collection, doc_id))

    # -- search
    async def search(
        self,
        collection: str,
        query: str,
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> SearchResult:
        """Top-k hits of one query with scores, norms and probabilities."""
        body = _search_body(k, filter, include_text, min_probability, target_precision)
        body["query"] = query
        result: SearchResult = await self._run(
            _Ops.search(collection, body, batch=False)
        )
        return result

    async def search_batch(
        self,
        collection: str,
        queries: Sequence[str],
        *,
        k: int | None = None,
        filter: Mapping[str, Any] | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> list[SearchResult]:
        """One :class:`SearchResult` per query, in order."""
        body = _search_body(k, filter, include_text, min_probability, target_precision)
        body["queries"] = list(queries)
        results: list[SearchResult] = await self._run(
            _Ops.search(collection, body, batch=True)
        )
        return results

    # -- calibrators
    async def fit_calibrator(
        self,
        collection: str,
        judgments: Sequence[JudgmentLike],
        *,
        method: CalibrationMethod = "auto",
        k: int = 20,
        abstain_target: float | None = 0.1,
        activate: bool = True,
    ) -> CalibratorInfo:
        """Fit (and by default activate) a calibrator from relevance judgments."""
        body = _fit_body(judgments, method, k, abstain_target, activate)
        return await self._run(_Ops.fit_calibrator(collection, body))

    async def list_calibrators(self, collection: str) -> list[CalibratorInfo]:
        """Calibrators fitted for a collection."""
        return await self._run(_Ops.list_calibrators(collection))

    async def get_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """One calibrator with its cross-validation metrics and norm lift."""
        return await self._run(_Ops.get_calibrator(collection, calibrator_id))

    async def activate_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Make a calibrator the one search uses."""
        return await self._run(_Ops.activate_calibrator(collection, calibrator_id))

    async def reliability_png(self, collection: str, calibrator_id: str) -> bytes:
        """The reliability diagram (PNG bytes)."""
        return await self._run(_Ops.reliability_png(collection, calibrator_id))

    async def calibrator_report(self, collection: str, calibrator_id: str) -> str:
        """The HTML report page."""
        return await self._run(_Ops.calibrator_report(collection, calibrator_id))

    async def feedback(
        self, collection: str, judgments: Sequence[JudgmentLike]
    ) -> dict[str, Any]:
        """Send relevance judgments collected in production."""
        return await self._run(_Ops.feedback(collection, judgments))
