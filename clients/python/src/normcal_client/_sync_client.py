"""The blocking client, generated from ``_async_client.py``: do not edit.

Edit the async client and run ``python scripts/unasync.py``; a test fails when
this file is not what the script writes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Self

import httpx

from normcal_client import _endpoints as ep
from normcal_client import _operations as op
from normcal_client._base import (
    DEFAULT_URL,
    ClientBase,
    R,
    Sleep,
    atomic_paths,
    default_tls,
    env_key,
    env_url,
    finish,
)
from normcal_client._errors import NormcalError, connection_failed, error_from_response
from normcal_client._models import (
    CalibrationMethod,
    CalibratorInfo,
    CalibratorList,
    CalibratorProfile,
    CalibratorSummary,
    CollectionInfo,
    DocumentOut,
    DocumentPage,
    DocumentsFound,
    DriftReport,
    EmbeddingsResponse,
    EmbedResponse,
    FeedbackDeleted,
    FeedbackPage,
    FeedbackResponse,
    FitJob,
    Health,
    InputType,
    JudgingNext,
    JudgingQueriesResponse,
    JudgingSuggestions,
    KeyInfo,
    MetadataMode,
    QueryLogInfo,
    Readiness,
    RerankResponse,
    SearchMode,
    SearchResult,
    SnapshotInfo,
    Stemmer,
    UnknownDocuments,
    UpsertResponse,
    VersionInfo,
)
from normcal_client._options import RetryPolicy


class NormcalClient(ClientBase):
    """Blocking client of the normcal HTTP API: one typed method per endpoint.

    Parameters
    ----------
    base_url:
        Where normcal listens, e.g. ``http://normcal:8000`` in compose.
    api_key:
        Bearer token (the server's ``NORMCAL_API_KEY``); ``None`` for no auth.
    timeout:
        Seconds per request (embedding big batches on CPU takes a while).
    retry:
        The :class:`RetryPolicy`; ``NO_RETRY`` disables retries.
    transport:
        An ``httpx.BaseTransport`` (tests: ``httpx.MockTransport``).
    http_client:
        A ready ``httpx.Client`` to use instead (the caller closes it).
    sleep:
        How to wait the seconds between attempts (``time.sleep``).
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
        sleep: Sleep = time.sleep,
    ) -> None:
        headers = self._setup(api_key, retry, owns_http=http_client is None)
        if http_client is None:
            http_client = httpx.Client(
                base_url=base_url,
                headers=headers,
                timeout=timeout,
                transport=transport,
                verify=default_tls(),
            )
        else:
            http_client.headers.update(headers)
        self.http = http_client
        self._sleep = sleep

    @classmethod
    def from_env(cls, **kwargs: Any) -> Self:
        """A client for ``$NORMCAL_URL`` (default localhost:8000) and ``$NORMCAL_API_KEY``."""
        kwargs.setdefault("api_key", env_key())
        return cls(env_url(), **kwargs)

    def close(self) -> None:
        """Close the connection pool (only when this client created it)."""
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: ep.Call[R]) -> R:
        return finish(call, self._respond(call, stream=False))

    def _respond(self, call: ep.Call[Any], *, stream: bool) -> httpx.Response:
        """The final answer to ``call``, retried per policy; a streamed one is open.

        An error answer is read in full (it is a small problem document).
        """
        retry, attempt = self._retry(call), 0
        while True:
            try:
                request = self._request(self.http, call)
                response = self.http.send(request, stream=stream)
            except httpx.TransportError as error:
                wait = retry.wait_after_failure(attempt, error)
                if wait is None:
                    raise connection_failed(
                        call.endpoint.method, call.path, error
                    ) from error
            else:
                wait = retry.wait_after_answer(attempt, response)
                if wait is None:
                    if not response.is_success:
                        response.read()
                        response.close()
                    return response
                response.close()
            self._sleep(wait)
            attempt += 1

    def _drive(self, plan: op.Plan[R]) -> R:
        reply: Any = None
        error: NormcalError | None = None
        while True:
            try:
                step = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                result: R = done.value
                return result
            reply, error = None, None
            if isinstance(step, op.Pause):
                self._sleep(step.seconds)
                continue
            try:
                reply = self._send(step)
            except NormcalError as failed:
                error = failed

    # -- health
    def healthz(self) -> Health:
        """Liveness: the process serves HTTP."""
        return self._drive(op.one(ep.HEALTH()))

    def readyz(self) -> Readiness:
        """Readiness: model loaded, collections open."""
        return self._drive(op.one(ep.READY()))

    def version(self) -> VersionInfo:
        """The normcal version, the serving model's identity, the shipped profiles."""
        return self._drive(op.one(ep.VERSION()))

    def key(self) -> KeyInfo:
        """The API key this client sends: its name, role and collections."""
        return self._drive(op.one(ep.KEY()))

    def wait_until_ready(
        self, timeout: float = 120.0, interval: float = 0.5
    ) -> Readiness:
        """Poll ``/readyz`` until it answers 200 (a sidecar may still be loading)."""
        return self._drive(op.wait_until_ready(timeout, interval))

    # -- embed
    def embed(
        self, texts: Sequence[str], input_type: InputType | None = None
    ) -> EmbedResponse:
        """Unit vectors, raw norms and token counts of ``texts``."""
        return self._drive(op.embed(texts, input_type))

    def embeddings(
        self,
        texts: str | Sequence[str],
        *,
        model: str | None = None,
        input_type: InputType | None = None,
        encoding_format: Literal["float", "base64"] | None = None,
    ) -> EmbeddingsResponse:
        """``POST /v1/embeddings``: OpenAI's shape (``data[i].embedding``, ``usage``).

        ``model`` must be the serving model's name or identity, or None.
        """
        return self._drive(op.embeddings(texts, model, input_type, encoding_format))

    # -- collections
    def create_collection(
        self,
        name: str,
        description: str | None = None,
        *,
        exist_ok: bool = False,
        stemmer: Stemmer | None = None,
        embedding: op.OwnEmbeddingLike | None = None,
    ) -> CollectionInfo:
        """Create a collection; with ``exist_ok`` an existing one is returned.

        ``stemmer`` ("porter" or "none") fixes how its BM25 index stems words.
        ``embedding`` (``{"dimension": D, "model": "name"}``) makes it a collection
        of your own vectors: documents, searches and fits then carry them.
        """
        return self._drive(
            op.create_collection(name, description, exist_ok, stemmer, embedding)
        )

    def list_collections(self) -> list[CollectionInfo]:
        """All collections."""
        return self._drive(op.list_collections())

    def get_collection(self, name: str) -> CollectionInfo:
        """One collection's counts, model and active calibrator."""
        return self._drive(op.one(ep.GET_COLLECTION(name=name)))

    def delete_collection(self, name: str) -> None:
        """Drop a collection and its files."""
        self._drive(op.one(ep.DELETE_COLLECTION(name=name)))

    # -- snapshots
    def create_snapshot(self, collection: str) -> SnapshotInfo:
        """Back a collection up now (consistent while writes go on)."""
        return self._drive(op.one(ep.CREATE_SNAPSHOT(name=collection)))

    def list_snapshots(self, collection: str) -> list[SnapshotInfo]:
        """A collection's snapshots, oldest first."""
        return (self._drive(op.one(ep.LIST_SNAPSHOTS(name=collection)))).data

    def download_snapshot(self, collection: str, snapshot_id: str) -> bytes:
        """The snapshot file (SQLite), what ``normcal restore`` installs."""
        call = ep.DOWNLOAD_SNAPSHOT(name=collection, snapshot_id=snapshot_id)
        return self._drive(op.one(call))

    def restore_snapshot(
        self, collection: str, snapshot_id: str, *, into: str | None = None
    ) -> CollectionInfo:
        """Replace a collection by one of its snapshots; the restored collection.

        ``into``: make a new collection of that name from the snapshot instead (the
        snapshot's collection keeps serving).
        """
        return self._drive(op.restore_snapshot(collection, snapshot_id, into))

    def upload_snapshot(
        self,
        collection: str,
        data: bytes | str | os.PathLike[str],
        *,
        replace: bool = False,
    ) -> CollectionInfo:
        """Make ``collection`` from a snapshot file (its bytes, or its path).

        The file, say another server's ``download_snapshot``, gets a restore's
        checks; a name that exists raises ``Conflict`` unless ``replace``. The file
        is read into memory and sent whole.
        """
        return self._drive(op.upload_snapshot(collection, data, replace))

    def delete_snapshot(self, collection: str, snapshot_id: str) -> None:
        """Delete one snapshot."""
        call = ep.DELETE_SNAPSHOT(name=collection, snapshot_id=snapshot_id)
        self._drive(op.one(call))

    # -- documents
    def upsert_documents(
        self,
        collection: str,
        documents: Iterable[op.DocumentLike],
        *,
        batch_size: int = op.DEFAULT_BATCH_SIZE,
        progress: op.Progress | None = None,
    ) -> UpsertResponse:
        """Upsert by id in atomic batches; ``progress(n)`` after each batch."""
        return self._drive(
            op.upsert_documents(collection, documents, batch_size, progress)
        )

    def get_document(self, collection: str, doc_id: str) -> DocumentOut:
        """One stored document with its norm."""
        call = ep.GET_DOCUMENT(name=collection, doc_id=doc_id)
        return self._drive(op.one(call))

    def get_documents(
        self,
        collection: str,
        ids: Iterable[str],
        *,
        batch_size: int = op.DEFAULT_IDS_PER_REQUEST,
    ) -> list[DocumentOut]:
        """The stored documents among ``ids``, once each, in order (unknown skipped).

        One batch get (``POST .../documents/get``) per ``batch_size`` ids.
        """
        return self._drive(op.get_documents(collection, ids, batch_size))

    def delete_document(self, collection: str, doc_id: str) -> None:
        """Delete one document."""
        call = ep.DELETE_DOCUMENT(name=collection, doc_id=doc_id)
        self._drive(op.one(call))

    def update_document(
        self,
        collection: str,
        doc_id: str,
        metadata: Mapping[str, Any],
        *,
        mode: MetadataMode = "merge",
    ) -> DocumentOut:
        """New metadata for one document, not re-embedded; the document as stored.

        ``merge`` sets the given keys and removes those given as None; ``replace``
        stores ``metadata`` as the whole object.
        """
        return self._drive(op.update_document(collection, doc_id, metadata, mode))

    def update_documents(
        self,
        collection: str,
        updates: Mapping[str, Mapping[str, Any]],
        *,
        mode: MetadataMode = "merge",
    ) -> list[DocumentOut]:
        """New metadata by document id, in one request: every one changes or none.

        An unknown id raises ``NotFound`` (nothing changed); see :meth:`update_document`.
        """
        return self._drive(op.update_documents(collection, updates, mode))

    def delete_documents(
        self,
        collection: str,
        ids: Iterable[str],
        *,
        missing_ok: bool = False,
        batch_size: int = op.DEFAULT_IDS_PER_REQUEST,
    ) -> int:
        """Delete documents by id, ``batch_size`` a request; how many were deleted.

        Without ``missing_ok`` an unknown id raises ``NotFound`` and nothing is deleted.
        """
        return self._drive(op.delete_documents(collection, ids, missing_ok, batch_size))

    def list_documents(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> DocumentPage:
        """One page in write order; pass ``next_cursor`` back until it is None."""
        return self._drive(op.list_documents(collection, limit, cursor))

    def iter_documents(
        self, collection: str, *, page_size: int | None = None
    ) -> Iterator[DocumentOut]:
        """Every document in write order, one page (``page_size``) a request."""
        cursor: str | None = None
        while True:
            page = self.list_documents(collection, limit=page_size, cursor=cursor)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def query_documents(
        self,
        collection: str,
        filter: op.Filter | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> DocumentPage:
        """One page of the documents whose metadata matches ``filter``, in write order.

        Pass ``next_cursor`` back as ``cursor`` (with the same filter) until it is
        None, or use :meth:`iter_documents_where`.
        """
        return self._drive(op.query_documents(collection, filter, limit, cursor))

    def iter_documents_where(
        self,
        collection: str,
        filter: op.Filter | None = None,
        *,
        page_size: int | None = None,
    ) -> Iterator[DocumentOut]:
        """Every document matching ``filter``, in write order, a page a request."""
        cursor: str | None = None
        while True:
            page = self.query_documents(
                collection, filter, limit=page_size, cursor=cursor
            )
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def count_documents(self, collection: str, filter: op.Filter | None = None) -> int:
        """How many documents match ``filter`` (every document without one)."""
        return self._drive(op.count_documents(collection, filter))

    def batch_get_documents(
        self, collection: str, ids: Iterable[str]
    ) -> DocumentsFound:
        """Several documents in one request; unknown ids come back in ``missing``."""
        return self._drive(op.batch_get_documents(collection, ids))

    def delete_documents_where(
        self,
        collection: str,
        filter: op.Filter | None = None,
        *,
        all: bool = False,
    ) -> int:
        """Delete by metadata equality (or everything with ``all=True``); the count."""
        return self._drive(op.delete_documents_where(collection, filter, all))

    def export_documents(self, collection: str) -> Iterator[str]:
        """The collection's JSONL lines (no newline), streamed as the server sends.

        An unknown collection raises on the first line asked for.
        """
        with self._export(collection) as response:
            yield from response.iter_lines()

    def export_documents_to(self, collection: str, path: str | os.PathLike[str]) -> int:
        """Stream the export into a file ``normcal ingest`` reads; the documents.

        Written to ``PATH.part`` and renamed into place once complete.
        """
        partial, final = atomic_paths(path)
        lines = 0
        with self._export(collection) as response:
            with partial.open("wb") as file:
                for chunk in response.iter_bytes():
                    file.write(chunk)
                    lines += chunk.count(b"\n")
        os.replace(partial, final)
        return lines

    @contextlib.contextmanager
    def _export(self, collection: str) -> Iterator[httpx.Response]:
        call = ep.EXPORT_DOCUMENTS(name=collection)
        response = self._respond(call, stream=True)
        try:
            if not response.is_success:
                raise error_from_response(response)
            yield response
        finally:
            response.close()

    # -- search
    def search(
        self,
        collection: str,
        query: str | None = None,
        *,
        vector: Sequence[float] | None = None,
        k: int | None = None,
        mode: SearchMode | None = None,
        candidates: int | None = None,
        filter: op.Filter | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> SearchResult:
        """Top-k hits of one query with scores, norms and probabilities.

        ``mode``: "dense" (cosine, the server's default), "lexical" (BM25) or "hybrid"
        (both top-``candidates`` lists ranked by calibrated probability).
        ``vector``: your own, on a collection created with ``embedding``; ``query``
        beside it is its text (BM25, and the probabilities need it).
        """
        plan = op.search(
            collection,
            query,
            vector=vector,
            k=k,
            filter=filter,
            include_text=include_text,
            min_probability=min_probability,
            target_precision=target_precision,
            mode=mode,
            candidates=candidates,
        )
        return (self._drive(plan))[0]

    def search_batch(
        self,
        collection: str,
        queries: Sequence[str] | None = None,
        *,
        vectors: Sequence[Sequence[float]] | None = None,
        k: int | None = None,
        mode: SearchMode | None = None,
        candidates: int | None = None,
        filter: op.Filter | None = None,
        include_text: bool = False,
        min_probability: float | None = None,
        target_precision: float | None = None,
    ) -> list[SearchResult]:
        """One :class:`SearchResult` per query (or own vector), in order."""
        plan = op.search(
            collection,
            None if queries is None else list(queries),
            vectors=vectors,
            k=k,
            filter=filter,
            include_text=include_text,
            min_probability=min_probability,
            target_precision=target_precision,
            mode=mode,
            candidates=candidates,
        )
        return self._drive(plan)

    # -- rerank
    def rerank(
        self,
        query: str,
        documents: Sequence[op.RerankDocumentLike],
        *,
        top_n: int | None = None,
        collection: str | None = None,
        return_documents: bool | None = None,
    ) -> RerankResponse:
        """Probabilities for another retriever's candidates, most probable first.

        ``documents`` in the order the retriever returned them: texts, or
        ``{"text", "id"?, "score"?, "metadata"?}`` (``score``: the retriever's own,
        any scale, for every document or none). ``collection``: calibrate with its
        active calibrator (and log the request for judging when its query log is
        on); without it, the shipped default for external lists.
        """
        return self._drive(
            op.rerank(query, documents, top_n, collection, return_documents)
        )

    # -- calibrators
    def fit_calibrator(
        self,
        collection: str,
        judgments: Iterable[op.JudgmentLike] = (),
        *,
        method: CalibrationMethod | None = None,
        k: int | None = None,
        abstain_target: float | Literal[False] | None = None,
        abstain_delta: float | None = None,
        activate: bool | None = None,
        include_feedback: bool | None = None,
        allow_reorder: bool | None = None,
        unknown_documents: UnknownDocuments | None = None,
        query_vectors: Mapping[str, Sequence[float]] | None = None,
        lists: Iterable[op.JudgedListLike] = (),
    ) -> CalibratorInfo:
        """Fit a calibrator and wait for it; ``None`` options take the server default.

        ``abstain_target=False`` fits without an abstain rule.
        ``unknown_documents="skip"`` leaves out judgments naming documents the
        collection does not hold (the answer's ``dropped_judgments`` counts them)
        instead of refusing the fit. ``query_vectors``: on a collection of your own
        vectors, each judged query's vector by its text. ``lists``: judged candidate
        lists of another retriever (``POST /v1/rerank``'s documents, each in the
        retriever's order, ``relevance`` on the judged ones), for a namespace that
        calibrates that retriever. A long fit holds the request open:
        :meth:`start_fit` returns at once instead.
        """
        body = op.fit_request(
            judgments,
            method=method,
            k=k,
            abstain_target=abstain_target,
            abstain_delta=abstain_delta,
            activate=activate,
            include_feedback=include_feedback,
            allow_reorder=allow_reorder,
            unknown_documents=unknown_documents,
            query_vectors=query_vectors,
            lists=lists,
        )
        return self._drive(op.one(ep.FIT_CALIBRATOR(body, name=collection)))

    def start_fit(
        self,
        collection: str,
        judgments: Iterable[op.JudgmentLike] = (),
        *,
        method: CalibrationMethod | None = None,
        k: int | None = None,
        abstain_target: float | Literal[False] | None = None,
        abstain_delta: float | None = None,
        activate: bool | None = None,
        include_feedback: bool | None = None,
        allow_reorder: bool | None = None,
        unknown_documents: UnknownDocuments | None = None,
        query_vectors: Mapping[str, Sequence[float]] | None = None,
        lists: Iterable[op.JudgedListLike] = (),
    ) -> FitJob:
        """Start a fit as a server job (202); poll it with :meth:`wait_fit_job`.

        The options are those of :meth:`fit_calibrator`; a bad request raises here.
        """
        body = op.fit_request(
            judgments,
            method=method,
            k=k,
            abstain_target=abstain_target,
            abstain_delta=abstain_delta,
            activate=activate,
            include_feedback=include_feedback,
            allow_reorder=allow_reorder,
            unknown_documents=unknown_documents,
            query_vectors=query_vectors,
            lists=lists,
        )
        return self._drive(op.one(ep.START_FIT_JOB(body, name=collection)))

    def get_fit_job(self, collection: str, job_id: str) -> FitJob:
        """One fit job: status, progress, and the calibrator or the error."""
        call = ep.GET_FIT_JOB(name=collection, job_id=job_id)
        return self._drive(op.one(call))

    def list_fit_jobs(self, collection: str) -> list[FitJob]:
        """The collection's fit jobs, newest first."""
        return (self._drive(op.one(ep.LIST_FIT_JOBS(name=collection)))).data

    def wait_fit_job(
        self,
        collection: str,
        job_id: str,
        timeout: float = 600.0,
        poll_interval: float = 1.0,
    ) -> FitJob:
        """Poll a fit job until it succeeded or failed; check ``status``/``error``.

        Raises ``TimeoutError`` when it is still queued or running after ``timeout``.
        """
        plan = op.wait_fit_job(collection, job_id, timeout, poll_interval)
        return self._drive(plan)

    def list_calibrators(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> CalibratorList:
        """One page of calibrators, oldest first; pass ``next_cursor`` for the next one.

        The shipped default comes first; the reports are not listed
        (``get_calibrator`` has one).
        """
        return self._drive(op.list_calibrators(collection, limit, cursor))

    def iter_calibrators(
        self, collection: str, *, page_size: int | None = None
    ) -> Iterator[CalibratorSummary]:
        """Every calibrator of a collection, oldest first, one page a request."""
        cursor: str | None = None
        while True:
            page = self.list_calibrators(collection, limit=page_size, cursor=cursor)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_calibrator(self, collection: str, calibrator_id: str) -> CalibratorInfo:
        """One calibrator with its cross-validation metrics and norm lift."""
        call = ep.GET_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def activate_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Make a calibrator the one search uses."""
        call = ep.ACTIVATE_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def calibrator_drift(self, collection: str, calibrator_id: str) -> DriftReport:
        """Whether the queries it served lately look like those it was judged on."""
        call = ep.CALIBRATOR_DRIFT(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def reliability_png(self, collection: str, calibrator_id: str) -> bytes:
        """The reliability diagram (PNG bytes)."""
        call = ep.RELIABILITY_PNG(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def calibrator_report(self, collection: str, calibrator_id: str) -> str:
        """The HTML report page."""
        call = ep.CALIBRATOR_REPORT(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def delete_calibrator(self, collection: str, calibrator_id: str) -> None:
        """Delete a fitted calibrator (not the active one, nor the default)."""
        call = ep.DELETE_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        self._drive(op.one(call))

    def export_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorProfile:
        """A calibrator as portable JSON (``model_dump()`` it to store it)."""
        call = ep.EXPORT_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return self._drive(op.one(call))

    def import_calibrator(
        self,
        collection: str,
        profile: CalibratorProfile | Mapping[str, Any],
        *,
        activate: bool | None = None,
    ) -> CalibratorInfo:
        """Add an exported calibrator under a new id (same embedding model only)."""
        return self._drive(op.import_calibrator(collection, profile, activate))

    def feedback(
        self, collection: str, judgments: Iterable[op.JudgmentLike]
    ) -> FeedbackResponse:
        """Store relevance judgments collected in production for the next fit."""
        return self._drive(op.feedback(collection, judgments))

    def list_feedback(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> FeedbackPage:
        """One page of stored feedback; pass ``next_cursor`` for the next one."""
        return self._drive(op.list_feedback(collection, limit, cursor))

    def delete_feedback(
        self,
        collection: str,
        *,
        query: str | None = None,
        document_id: str | None = None,
    ) -> FeedbackDeleted:
        """Delete stored feedback (all, one query's, or one pair's); returns how many."""
        return self._drive(op.delete_feedback(collection, query, document_id))

    # -- judging
    def query_log(self, collection: str) -> QueryLogInfo:
        """The query log's settings and size."""
        return self._drive(op.one(ep.GET_QUERY_LOG(name=collection)))

    def set_query_log(
        self, collection: str, *, enabled: bool, retention: int | None = None
    ) -> QueryLogInfo:
        """Record (or stop recording) searched query texts, keeping ``retention``."""
        return self._drive(op.set_query_log(collection, enabled, retention))

    def add_judging_queries(
        self, collection: str, queries: Sequence[str]
    ) -> JudgingQueriesResponse:
        """Queue queries to judge before any logged one."""
        return self._drive(op.add_judging_queries(collection, queries))

    def next_to_judge(
        self, collection: str, *, k: int | None = None, query: str | None = None
    ) -> JudgingNext:
        """The next query to judge (or ``query``), its top hits and the progress."""
        return self._drive(op.next_to_judge(collection, k, query))

    def skip_query(self, collection: str, query: str) -> None:
        """Do not offer ``query`` for judging again."""
        self._drive(op.skip_query(collection, query))

    def undo_judgment(
        self, collection: str, query: str, document_id: str
    ) -> FeedbackDeleted:
        """Take back one judgment of ``query`` (the judging page's undo; a judge key may)."""
        return self._drive(op.undo_judgment(collection, query, document_id))

    def unskip_query(self, collection: str, query: str) -> None:
        """Offer a skipped ``query`` for judging again."""
        self._drive(op.unskip_query(collection, query))

    def judging_suggestions(
        self, collection: str, *, n: int | None = None
    ) -> JudgingSuggestions:
        """Keyword queries drawn from the documents, to start judging with."""
        return self._drive(op.judging_suggestions(collection, n))
