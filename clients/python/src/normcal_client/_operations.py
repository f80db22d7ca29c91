"""What each client method does, written once for both clients.

An operation is a generator: it yields the requests (:class:`~._endpoints.Call`) or
pauses (:class:`Pause`) it needs and receives each answer, or has the typed error
thrown in where it was yielded. ``NormcalClient`` drives it with blocking I/O,
``AsyncNormcalClient`` with ``await``; neither repeats the logic (batching,
create-if-missing, polling, building bodies).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel

from normcal_client import _endpoints as ep
from normcal_client._errors import (
    Conflict,
    ConnectionFailed,
    InvalidArgument,
    Loc,
    ServerError,
    ServiceUnavailable,
    documents_not_found,
    refused,
)
from normcal_client._models import (
    BatchSearchResponse,
    CalibrationMethod,
    CalibratorImport,
    CalibratorInfo,
    CalibratorList,
    CalibratorProfile,
    CollectionCreate,
    CollectionInfo,
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentPatch,
    DocumentsCount,
    DocumentsCountRequest,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    DocumentsGetRequest,
    DocumentsQueryRequest,
    DocumentsUpdated,
    DocumentsUpdateRequest,
    DocumentUpdate,
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
    JudgingQueriesRequest,
    JudgingQueriesResponse,
    JudgingSuggestions,
    Judgment,
    MetadataMode,
    OwnEmbedding,
    QueryLogInfo,
    QueryLogSettings,
    Readiness,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RestoreRequest,
    SearchMode,
    SearchRequest,
    SearchResult,
    SkipRequest,
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
    body = EmbedRequest(texts=_listed(texts, "texts"), **_given(input_type=input_type))
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
    own = None if embedding is None else _model(OwnEmbedding, embedding, "embedding")
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
    _check_batch_size(batch_size)
    total = UpsertResponse(upserted=0, ids=[], truncated=[])
    sent = 0
    for batch in _batches(documents, batch_size):
        docs = [_document(d, sent + i) for i, d in enumerate(batch)]
        sent += len(batch)
        body = UpsertRequest(documents=docs)
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
    _check_batch_size(batch_size)
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
    _check_batch_size(batch_size)
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
    body = DocumentsGetRequest(ids=_listed(ids, "ids"))
    return one(ep.GET_DOCUMENTS(body, name=collection))


def query_documents(
    collection: str, filter: Filter | None, limit: int | None, cursor: str | None
) -> Plan[DocumentPage]:
    """One page of the documents matching ``filter``, in write order."""
    options = _given(filter=_filter(filter), limit=limit, cursor=cursor)
    return one(ep.QUERY_DOCUMENTS(DocumentsQueryRequest(**options), name=collection))


def count_documents(collection: str, filter: Filter | None) -> Plan[int]:
    """How many documents match ``filter`` (all of them with none)."""
    body = DocumentsCountRequest(**_given(filter=_filter(filter)))
    found: DocumentsCount = yield ep.COUNT_DOCUMENTS(body, name=collection)
    return found.count


def update_document(
    collection: str, doc_id: str, metadata: Mapping[str, Any], mode: MetadataMode
) -> Plan[DocumentOut]:
    """New metadata for one document."""
    body = DocumentPatch(metadata=_dict(metadata, "metadata"), mode=mode)
    return one(ep.UPDATE_DOCUMENT(body, name=collection, doc_id=doc_id))


def update_documents(
    collection: str, updates: Mapping[str, Mapping[str, Any]], mode: MetadataMode
) -> Plan[list[DocumentOut]]:
    """New metadata for several documents, in one request."""
    if not isinstance(updates, Mapping):
        raise refused("updates", "a mapping of document id to its new metadata")
    body = DocumentsUpdateRequest(
        updates=[
            DocumentUpdate(id=doc_id, metadata=_dict(meta, ("updates", doc_id)))
            for doc_id, meta in updates.items()
        ],
        mode=mode,
    )
    done: DocumentsUpdated = yield ep.UPDATE_DOCUMENTS(body, name=collection)
    return done.data


def restore_snapshot(
    collection: str, snapshot_id: str, into: str | None
) -> Plan[CollectionInfo]:
    """Restore a snapshot in place, or into a new collection."""
    body = RestoreRequest(**_given(into=into))
    return one(ep.RESTORE_SNAPSHOT(body, name=collection, snapshot_id=snapshot_id))


def upload_snapshot(
    collection: str, data: bytes | str | os.PathLike[str], overwrite: bool
) -> Plan[CollectionInfo]:
    """Send a snapshot file (its bytes, or its path) to become ``collection``."""
    if isinstance(data, str | os.PathLike):
        data = Path(data).read_bytes()
    if not isinstance(data, bytes):
        raise refused("data", "the snapshot file's bytes, or its path")
    call = _with_query(ep.UPLOAD_SNAPSHOT(name=collection), replace=_flag(overwrite))
    return one(replace(call, content=data))


def add_judging_queries(
    collection: str, queries: Sequence[str]
) -> Plan[JudgingQueriesResponse]:
    """Queue queries to judge first."""
    body = JudgingQueriesRequest(queries=_listed(queries, "queries"))
    return one(ep.ADD_JUDGING_QUERIES(body, name=collection))


def skip_query(collection: str, query: str) -> Plan[None]:
    """Never offer ``query`` for judging again."""
    return one(ep.SKIP_QUERY(SkipRequest(query=query), name=collection))


def delete_documents_where(
    collection: str, filter: Filter | None, all: bool
) -> Plan[int]:
    """Delete the documents matching ``filter`` (or every one with ``all``)."""
    body = DocumentsDeleteRequest(
        **_given(filter=_filter(filter) or None, all=all or None)
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
        filter=_filter(filter),
        min_probability=min_probability,
        target_precision=target_precision,
        vector=_vector(vector, "vector"),
        vectors=None
        if vectors is None
        else [_vector(v, ("vectors", i)) for i, v in enumerate(vectors)],
    )
    if isinstance(queries, str) or vector is not None:
        body = SearchRequest(
            include_text=include_text, **options, **_given(query=queries)
        )
        result: SearchResult = yield ep.SEARCH(body, name=collection)
        return [result]
    texts = None if queries is None else _listed(queries, "queries")
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
        else {
            q: _vector(v, ("query_vectors", q))
            for q, v in _dict(query_vectors, "query_vectors").items()
        },
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
        else _dict(profile, "profile")
    )
    body = CalibratorImport(profile=data, **_given(activate=activate))
    return one(ep.IMPORT_CALIBRATOR(body, name=collection))


def list_calibrators(
    collection: str, limit: int | None, cursor: str | None
) -> Plan[CalibratorList]:
    """One page of a collection's calibrators after ``cursor`` (no reports)."""
    call = ep.LIST_CALIBRATORS(name=collection)
    return one(_with_query(call, limit=limit, cursor=cursor))


def list_feedback(
    collection: str, limit: int | None, cursor: str | None
) -> Plan[FeedbackPage]:
    """One page of stored feedback after ``cursor``."""
    call = ep.LIST_FEEDBACK(name=collection)
    return one(_with_query(call, limit=limit, cursor=cursor))


def delete_feedback(
    collection: str, query: str | None, document_id: str | None = None
) -> Plan[FeedbackDeleted]:
    """Delete stored feedback: all of it, ``query``'s, or its ``document_id``'s."""
    call = ep.DELETE_FEEDBACK(name=collection)
    return one(_with_query(call, query=query, document_id=document_id))


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


def next_to_judge(
    collection: str, k: int | None, query: str | None = None
) -> Plan[JudgingNext]:
    """The next query to judge (or ``query``), with its top ``k`` hits (default 10)."""
    call = ep.NEXT_TO_JUDGE(name=collection)
    return one(_with_query(call, k=None if k is None else int(k), query=query))


def unskip_query(collection: str, query: str) -> Plan[None]:
    """Offer a skipped query for judging again."""
    return one(_with_query(ep.UNSKIP_QUERY(name=collection), query=query))


def undo_judgment(
    collection: str, query: str, document_id: str
) -> Plan[FeedbackDeleted]:
    """Take back one (query, document) judgment (a judge key may)."""
    call = ep.UNDO_JUDGMENT(name=collection)
    return one(_with_query(call, query=query, document_id=document_id))


def judging_suggestions(collection: str, n: int | None) -> Plan[JudgingSuggestions]:
    """Keyword queries drawn from the documents (server default 5)."""
    call = ep.JUDGING_SUGGESTIONS(name=collection)
    return one(_with_query(call, n=None if n is None else int(n)))


def _given(**fields: Any) -> dict[str, Any]:
    """The fields the caller gave: ``None`` means "the server's default"."""
    return {key: value for key, value in fields.items() if value is not None}


def _unique(ids: Iterable[str]) -> list[str]:
    """``ids`` once each, in order (one string is refused: it is not a list of ids)."""
    return list(dict.fromkeys(_listed(ids, "ids")))


def _judgments(items: Iterable[JudgmentLike]) -> list[Judgment]:
    return [
        _model(Judgment, item, ("judgments", i))
        for i, item in enumerate(_listed(items, "judgments"))
    ]


M = TypeVar("M", bound=BaseModel)


def _model(cls: type[M], value: M | Mapping[str, Any], field: Loc) -> M:
    """``value`` as a ``cls`` (a mapping of its fields); refusals name ``field``."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise refused(
            field, f"a mapping of {cls.__name__}'s fields or a {cls.__name__}"
        )
    try:
        return cls(**{str(k): v for k, v in value.items()})
    except InvalidArgument as error:
        raise error.at(*(field if isinstance(field, tuple) else (field,))) from None


def _document(value: DocumentLike, n: int) -> DocumentIn:
    """The ``n``-th document of a call, its vector and metadata as the server takes them."""
    if isinstance(value, Mapping):
        value = {
            **value,
            **(
                {"vector": _vector(value["vector"], ("documents", n, "vector"))}
                if value.get("vector") is not None
                else {}
            ),
            **(
                {"metadata": _dict(value["metadata"], ("documents", n, "metadata"))}
                if value.get("metadata") is not None
                else {}
            ),
        }
    return _model(DocumentIn, value, ("documents", n))


def _listed(values: Iterable[Any], field: Loc) -> list[Any]:
    """``values`` as a list; one string (or a mapping) is refused, naming ``field``."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise refused(field, "a list (or other iterable) of items, not one value")
    return list(values)


def _vector(values: Sequence[float] | None, field: Loc) -> list[float] | None:
    """A vector (a list, tuple or array of numbers) as a list of floats."""
    if values is None:
        return None
    try:
        return [float(x) for x in _listed(values, field)]
    except (TypeError, ValueError):
        raise refused(field, "a list of numbers") from None


def _dict(value: Mapping[str, Any], field: Loc) -> dict[str, Any]:
    """A JSON object's mapping as a dict; anything else is refused, naming ``field``."""
    if not isinstance(value, Mapping):
        raise refused(field, "a JSON object (a mapping)")
    return dict(value)


def _filter(value: Filter | None) -> dict[str, Any] | None:
    """A metadata filter as a dict (None: no filter)."""
    return None if value is None else _dict(value, "filter")


def _flag(value: bool) -> str | None:
    """A boolean query parameter: ``true``, or absent (the server's false)."""
    if not isinstance(value, bool):
        raise refused("replace", "True or False")
    return "true" if value else None


def _check_batch_size(batch_size: int) -> None:
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise refused("batch_size", "an integer of at least 1")


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
