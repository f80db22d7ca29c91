"""What each client method does, written once for both clients.

An operation is a generator: it yields the requests (:class:`~._endpoints.Call`) or
pauses (:class:`Pause`) it needs and receives each answer, or has the typed error
thrown in where it was yielded. ``NormcalClient`` drives it with blocking I/O,
``AsyncNormcalClient`` with ``await``; neither repeats the logic (batching,
create-if-missing, polling, building bodies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from normcal_client import _endpoints as ep
from normcal_client._errors import (
    Conflict,
    ConnectionFailed,
    ServerError,
    ServiceUnavailable,
    documents_not_found,
)
from normcal_client._models import (
    BatchSearchResponse,
    CalibrationMethod,
    CalibratorImport,
    CalibratorInfo,
    CalibratorProfile,
    CollectionCreate,
    CollectionInfo,
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    DocumentsGetRequest,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    FeedbackDeleted,
    FeedbackPage,
    FeedbackRequest,
    FeedbackResponse,
    FitJob,
    FitRequest,
    InputType,
    JudgedList,
    JudgingNext,
    Judgment,
    OwnEmbedding,
    QueryLogInfo,
    QueryLogSettings,
    Readiness,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    SearchMode,
    SearchRequest,
    SearchResult,
    Stemmer,
    UnknownDocuments,
    UpsertRequest,
    UpsertResponse,
)
from normcal_client._options import NO_RETRY

R = TypeVar("R")

DocumentLike = DocumentIn | Mapping[str, Any]
OwnEmbeddingLike = OwnEmbedding | Mapping[str, Any]
JudgmentLike = Judgment | Mapping[str, Any]
# A candidate: its text, or {"text", "id"?, "score"?, "metadata"?}.
RerankDocumentLike = str | RerankDocument | Mapping[str, Any]
# A judged list: {"query", "documents": [text | {"text", "relevance"?, ...}]}.
JudgedListLike = JudgedList | Mapping[str, Any]
Filter = Mapping[str, Any]  # the server's filter language (see _models.FilterJSON)
Progress = Callable[[int], None]
DEFAULT_BATCH_SIZE = 128  # the server accepts 256 per upsert by default
DEFAULT_IDS_PER_REQUEST = 500  # the server accepts 1000 per batch get/delete by default


@dataclass(frozen=True)
class Pause:
    """Ask the driver to sleep (with its own, injectable, sleep)."""

    seconds: float


Step = ep.Call[Any] | Pause
Plan = Generator[Step, Any, R]


def one(call: ep.Call[R]) -> Plan[R]:
    """A single request."""
    result: R = yield call
    return result


def wait_until_ready(timeout: float, interval: float) -> Plan[Readiness]:
    """Poll ``/readyz`` (without retries) until it answers 200 or time runs out."""
    deadline = time.monotonic() + timeout
    call = replace(ep.READY(), retry=NO_RETRY)
    while True:
        try:
            ready: Readiness = yield call
            return ready
        except (ConnectionFailed, ServiceUnavailable, ServerError):
            if time.monotonic() >= deadline:
                raise
        yield Pause(interval)


def embed(texts: Sequence[str], input_type: InputType | None) -> Plan[EmbedResponse]:
    """Embed texts."""
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string")
    body = EmbedRequest(texts=list(texts), **_given(input_type=input_type))
    return one(ep.EMBED(body))


def embeddings(
    texts: str | Sequence[str],
    model: str | None,
    input_type: InputType | None,
    encoding_format: Literal["float", "base64"] | None,
) -> Plan[EmbeddingsResponse]:
    """Embed texts in OpenAI's shape."""
    body = EmbeddingsRequest(
        input=texts if isinstance(texts, str) else list(texts),
        **_given(model=model, input_type=input_type, encoding_format=encoding_format),
    )
    return one(ep.EMBEDDINGS(body))


def rerank(
    query: str,
    documents: Sequence[RerankDocumentLike],
    top_n: int | None,
    collection: str | None,
    return_documents: bool | None,
) -> Plan[RerankResponse]:
    """Calibrate another retriever's candidates for ``query``."""
    if isinstance(documents, str):
        raise TypeError("documents must be a sequence, not one string")
    body = RerankRequest(
        query=query,
        documents=[
            RerankDocument(text=d)
            if isinstance(d, str)
            else RerankDocument.model_validate(d)
            for d in documents
        ],
        **_given(top_n=top_n, collection=collection, return_documents=return_documents),
    )
    return one(ep.RERANK(body))


def create_collection(
    name: str,
    description: str | None,
    exist_ok: bool,
    stemmer: Stemmer | None = None,
    embedding: OwnEmbeddingLike | None = None,
) -> Plan[CollectionInfo]:
    """Create a collection; with ``exist_ok`` return the existing one instead."""
    own = None if embedding is None else OwnEmbedding.model_validate(embedding)
    body = CollectionCreate(
        name=name,
        **_given(description=description, stemmer=stemmer, embedding=own),
    )
    try:
        created: CollectionInfo = yield ep.CREATE_COLLECTION(body)
        return created
    except Conflict:
        if not exist_ok:
            raise
    existing: CollectionInfo = yield ep.GET_COLLECTION(name=name)
    return existing


def list_collections() -> Plan[list[CollectionInfo]]:
    """All collections."""
    page = yield ep.LIST_COLLECTIONS()
    return list(page.data)


def upsert_documents(
    collection: str,
    documents: Iterable[DocumentLike],
    batch_size: int,
    progress: Progress | None,
) -> Plan[UpsertResponse]:
    """Upsert in atomic batches of ``batch_size``, reporting the running count."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    total = UpsertResponse(upserted=0, ids=[], truncated=[])
    for batch in _batches(documents, batch_size):
        body = UpsertRequest(documents=[DocumentIn.model_validate(d) for d in batch])
        part: UpsertResponse = yield ep.UPSERT_DOCUMENTS(body, name=collection)
        total.upserted += part.upserted
        total.ids.extend(part.ids)
        total.truncated.extend(part.truncated)
        if progress is not None:
            progress(total.upserted)
    return total


def get_documents(
    collection: str, ids: Iterable[str], batch_size: int
) -> Plan[list[DocumentOut]]:
    """The stored documents among ``ids`` (once each, in order), ``batch_size`` a request.

    Unknown ids are skipped.
    """
    found: list[DocumentOut] = []
    for batch in _batches(_unique(ids), batch_size):
        page: DocumentsFound = yield ep.GET_DOCUMENTS(
            DocumentsGetRequest(ids=batch), name=collection
        )
        found += page.data
    return found


def delete_documents(
    collection: str, ids: Iterable[str], missing_ok: bool, batch_size: int
) -> Plan[int]:
    """Delete documents by id, ``batch_size`` a request; how many were deleted.

    Without ``missing_ok`` the ids are looked up first (batch gets): an unknown one
    raises :class:`NotFound` before anything is deleted.
    """
    wanted = _unique(ids)
    if not missing_ok:
        missing: list[str] = []
        for batch in _batches(wanted, batch_size):
            page: DocumentsFound = yield ep.GET_DOCUMENTS(
                DocumentsGetRequest(ids=batch), name=collection
            )
            missing += page.missing
        if missing:
            raise documents_not_found(collection, missing)
    deleted = 0
    for batch in _batches(wanted, batch_size):
        done: DocumentsDeleted = yield ep.DELETE_DOCUMENTS(
            DocumentsDeleteRequest(ids=batch), name=collection
        )
        deleted += done.deleted
    return deleted


def list_documents(
    collection: str, limit: int | None, cursor: str | None
) -> Plan[DocumentPage]:
    """One page of documents in write order; pass ``next_cursor`` as ``cursor``."""
    call = ep.LIST_DOCUMENTS(name=collection)
    query = urlencode(_given(limit=limit, cursor=cursor))
    return one(replace(call, path=f"{call.path}?{query}") if query else call)


def batch_get_documents(collection: str, ids: Iterable[str]) -> Plan[DocumentsFound]:
    """Several documents in one request, with the ids that were ``missing``."""
    if isinstance(ids, str):
        raise TypeError("ids must be an iterable of strings, not one string")
    body = DocumentsGetRequest(ids=list(ids))
    return one(ep.GET_DOCUMENTS(body, name=collection))


def delete_documents_where(
    collection: str, filter: Filter | None, all: bool
) -> Plan[int]:
    """Delete the documents matching ``filter`` (or every one with ``all``)."""
    body = DocumentsDeleteRequest(
        **_given(filter=dict(filter) if filter else None, all=all or None)
    )
    done: DocumentsDeleted = yield ep.DELETE_DOCUMENTS(body, name=collection)
    return done.deleted


def search(
    collection: str,
    queries: str | Sequence[str] | None,
    *,
    k: int | None,
    filter: Filter | None,
    include_text: bool,
    min_probability: float | None,
    target_precision: float | None,
    mode: SearchMode | None = None,
    candidates: int | None = None,
    vector: Sequence[float] | None = None,
    vectors: Sequence[Sequence[float]] | None = None,
) -> Plan[list[SearchResult]]:
    """One result per query; a single ``str`` (or ``vector``) is sent as ``query``.

    ``vector``/``vectors``: the client's own, with the texts (optional) beside them.
    """
    options = _given(
        k=k,
        mode=mode,
        candidates=candidates,
        filter=dict(filter) if filter is not None else None,
        min_probability=min_probability,
        target_precision=target_precision,
        vector=None if vector is None else list(vector),
        vectors=None if vectors is None else [list(v) for v in vectors],
    )
    if isinstance(queries, str) or vector is not None:
        body = SearchRequest(
            include_text=include_text, **options, **_given(query=queries)
        )
        result: SearchResult = yield ep.SEARCH(body, name=collection)
        return [result]
    texts = None if queries is None else list(queries)
    body = SearchRequest(include_text=include_text, **options, **_given(queries=texts))
    batch: BatchSearchResponse = yield ep.SEARCH_BATCH(body, name=collection)
    return list(batch.results)


def fit_request(
    judgments: Iterable[JudgmentLike],
    *,
    method: CalibrationMethod | None,
    k: int | None,
    abstain_target: float | Literal[False] | None,
    abstain_delta: float | None,
    activate: bool | None,
    include_feedback: bool | None,
    allow_reorder: bool | None,
    unknown_documents: UnknownDocuments | None = None,
    query_vectors: Mapping[str, Sequence[float]] | None = None,
    lists: Iterable[JudgedListLike] = (),
) -> FitRequest:
    """The body of a fit; options left ``None`` take the server's defaults.

    ``query_vectors``: on a collection of the client's own vectors, each judged
    query's vector by its text. ``lists``: judged candidate lists of another
    retriever (a document may be its bare text: not judged).
    """
    options = _given(
        query_vectors=None
        if query_vectors is None
        else {q: list(v) for q, v in query_vectors.items()},
        method=method,
        k=k,
        abstain_target=abstain_target,
        abstain_delta=abstain_delta,
        activate=activate,
        include_feedback=include_feedback,
        allow_reorder=allow_reorder,
        unknown_documents=unknown_documents,
    )
    if options.get("abstain_target") is False:
        options["abstain_target"] = None  # no abstain rule
    listed = [_judged_list(item) for item in lists]
    if listed:  # sent only when given, as the options are
        options["lists"] = listed
    return FitRequest(judgments=_judgments(judgments), **options)


def wait_fit_job(
    collection: str, job_id: str, timeout: float, poll_interval: float
) -> Plan[FitJob]:
    """Poll a fit job until it succeeded or failed (``TimeoutError`` past timeout)."""
    deadline = time.monotonic() + timeout
    call = ep.GET_FIT_JOB(name=collection, job_id=job_id)
    while True:
        job: FitJob = yield call
        if job.status in ("succeeded", "failed"):
            return job
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"fit job {job_id} is still {job.status} after {timeout} s"
            )
        yield Pause(poll_interval)


def feedback(
    collection: str, judgments: Iterable[JudgmentLike]
) -> Plan[FeedbackResponse]:
    """Store production judgments for the next fit."""
    body = FeedbackRequest(judgments=_judgments(judgments))
    return one(ep.FEEDBACK(body, name=collection))


def import_calibrator(
    collection: str,
    profile: CalibratorProfile | Mapping[str, Any],
    activate: bool | None,
) -> Plan[CalibratorInfo]:
    """Add an exported profile to ``collection`` under a new id."""
    data = (
        profile.model_dump(mode="json")
        if isinstance(profile, CalibratorProfile)
        else dict(profile)
    )
    body = CalibratorImport(profile=data, **_given(activate=activate))
    return one(ep.IMPORT_CALIBRATOR(body, name=collection))


def list_feedback(
    collection: str, limit: int | None, cursor: str | None
) -> Plan[FeedbackPage]:
    """One page of stored feedback after ``cursor``."""
    call = ep.LIST_FEEDBACK(name=collection)
    return one(_with_query(call, limit=limit, cursor=cursor))


def delete_feedback(collection: str, query: str | None) -> Plan[FeedbackDeleted]:
    """Delete stored feedback: all of it, or ``query``'s judgments."""
    return one(_with_query(ep.DELETE_FEEDBACK(name=collection), query=query))


def _with_query(call: ep.Call[R], **params: str | int | None) -> ep.Call[R]:
    """``call`` with the given (not ``None``) query parameters."""
    given = {k: v for k, v in params.items() if v is not None}
    return replace(call, path=f"{call.path}?{urlencode(given)}") if given else call


def set_query_log(
    collection: str, enabled: bool, retention: int | None
) -> Plan[QueryLogInfo]:
    """Turn a collection's query log on or off."""
    body = QueryLogSettings(**_given(enabled=enabled, retention=retention))
    return one(ep.SET_QUERY_LOG(body, name=collection))


def next_to_judge(collection: str, k: int | None) -> Plan[JudgingNext]:
    """The next query to judge, with its top ``k`` hits (server default 10)."""
    call = ep.NEXT_TO_JUDGE(name=collection)
    if k is not None:
        call = replace(call, path=f"{call.path}?k={int(k)}")
    return one(call)


def _given(**fields: Any) -> dict[str, Any]:
    """The fields the caller gave: ``None`` means "the server's default"."""
    return {key: value for key, value in fields.items() if value is not None}


def _unique(ids: Iterable[str]) -> list[str]:
    """``ids`` once each, in order (one string is refused: it is not a list of ids)."""
    if isinstance(ids, str):
        raise TypeError("ids must be an iterable of strings, not one string")
    return list(dict.fromkeys(ids))


def _judgments(items: Iterable[JudgmentLike]) -> list[Judgment]:
    return [Judgment.model_validate(item) for item in items]


def _judged_list(item: JudgedListLike) -> JudgedList:
    if isinstance(item, JudgedList):
        return item
    documents = item.get("documents")
    if isinstance(documents, list | tuple):  # bare texts are unjudged documents
        documents = [{"text": d} if isinstance(d, str) else d for d in documents]
    return JudgedList.model_validate({**item, "documents": documents})


def _batches(items: Iterable[R], size: int) -> Iterator[list[R]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch
