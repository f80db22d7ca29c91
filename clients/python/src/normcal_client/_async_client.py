"""The async client: a thin driver of the operations in ``_operations``.

Each public method is one line that hands an operation to the client's driver;
requests, retries, errors and bodies are built once, in ``_operations`` and
``_base``. The blocking :class:`NormcalClient` (``_sync_client.py``) is generated
from this file by ``scripts/unasync.py``, which deletes ``async``/``await`` and
renames the async names (``aclose`` -> ``close``, ``AsyncIterator`` -> ``Iterator``,
…): edit this file, then run the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, Self

import httpx

from normcal_client import _endpoints as ep
from normcal_client import _operations as op
from normcal_client._base import (
    DEFAULT_URL,
    AsyncSleep,
    ClientBase,
    R,
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


class AsyncNormcalClient(ClientBase):
    """Async client of the normcal HTTP API: one typed method per endpoint.

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
        An ``httpx.AsyncBaseTransport`` (tests: ``httpx.MockTransport``).
    http_client:
        A ready ``httpx.AsyncClient`` to use instead (the caller closes it).
    sleep:
        How to wait the seconds between attempts (``asyncio.sleep``).
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
        sleep: AsyncSleep = asyncio.sleep,
    ) -> None:
        headers = self._setup(api_key, retry, owns_http=http_client is None)
        if http_client is None:
            http_client = httpx.AsyncClient(
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

    async def aclose(self) -> None:
        """Close the connection pool (only when this client created it)."""
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: ep.Call[R]) -> R:
        return finish(call, await self._respond(call, stream=False))

    async def _respond(self, call: ep.Call[Any], *, stream: bool) -> httpx.Response:
        """The final answer to ``call``, retried per policy; a streamed one is open.

        An error answer is read in full (it is a small problem document).
        """
        retry, attempt = self._retry(call), 0
        while True:
            try:
                request = self._request(self.http, call)
                response = await self.http.send(request, stream=stream)
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
                        await response.aread()
                        await response.aclose()
                    return response
                await response.aclose()
            await self._sleep(wait)
            attempt += 1

    async def _drive(self, plan: op.Plan[R]) -> R:
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
                await self._sleep(step.seconds)
                continue
            try:
                reply = await self._send(step)
            except NormcalError as failed:
                error = failed

    # -- health
    async def healthz(self) -> Health:
        """Liveness: the process serves HTTP."""
        return await self._drive(op.one(ep.HEALTH()))

    async def readyz(self) -> Readiness:
        """Readiness: model loaded, collections open."""
        return await self._drive(op.one(ep.READY()))

    async def version(self) -> VersionInfo:
        """The normcal version, the serving model's identity, the shipped profiles."""
        return await self._drive(op.one(ep.VERSION()))

    async def key(self) -> KeyInfo:
        """The API key this client sends: its name, role and collections."""
        return await self._drive(op.one(ep.KEY()))

    async def wait_until_ready(
        self, timeout: float = 120.0, interval: float = 0.5
    ) -> Readiness:
        """Poll ``/readyz`` until it answers 200 (a sidecar may still be loading)."""
        return await self._drive(op.wait_until_ready(timeout, interval))

    # -- embed
    async def embed(
        self, texts: Sequence[str], input_type: InputType | None = None
    ) -> EmbedResponse:
        """Unit vectors, raw norms and token counts of ``texts``."""
        return await self._drive(op.embed(texts, input_type))

    async def embeddings(
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
        return await self._drive(
            op.embeddings(texts, model, input_type, encoding_format)
        )

    # -- collections
    async def create_collection(
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
        return await self._drive(
            op.create_collection(name, description, exist_ok, stemmer, embedding)
        )

    async def list_collections(self) -> list[CollectionInfo]:
        """All collections."""
        return await self._drive(op.list_collections())

    async def get_collection(self, name: str) -> CollectionInfo:
        """One collection's counts, model and active calibrator."""
        return await self._drive(op.one(ep.GET_COLLECTION(name=name)))

    async def delete_collection(self, name: str) -> None:
        """Drop a collection and its files."""
        await self._drive(op.one(ep.DELETE_COLLECTION(name=name)))

    # -- snapshots
    async def create_snapshot(self, collection: str) -> SnapshotInfo:
        """Back a collection up now (consistent while writes go on)."""
        return await self._drive(op.one(ep.CREATE_SNAPSHOT(name=collection)))

    async def list_snapshots(self, collection: str) -> list[SnapshotInfo]:
        """A collection's snapshots, oldest first."""
        return (await self._drive(op.one(ep.LIST_SNAPSHOTS(name=collection)))).data

    async def download_snapshot(self, collection: str, snapshot_id: str) -> bytes:
        """The snapshot file (SQLite), what ``normcal restore`` installs."""
        call = ep.DOWNLOAD_SNAPSHOT(name=collection, snapshot_id=snapshot_id)
        return await self._drive(op.one(call))

    async def restore_snapshot(
        self, collection: str, snapshot_id: str, *, into: str | None = None
    ) -> CollectionInfo:
        """Replace a collection by one of its snapshots; the restored collection.

        ``into``: make a new collection of that name from the snapshot instead (the
        snapshot's collection keeps serving).
        """
        return await self._drive(op.restore_snapshot(collection, snapshot_id, into))

    async def upload_snapshot(
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
        return await self._drive(op.upload_snapshot(collection, data, replace))

    async def delete_snapshot(self, collection: str, snapshot_id: str) -> None:
        """Delete one snapshot."""
        call = ep.DELETE_SNAPSHOT(name=collection, snapshot_id=snapshot_id)
        await self._drive(op.one(call))

    # -- documents
    async def upsert_documents(
        self,
        collection: str,
        documents: Iterable[op.DocumentLike],
        *,
        batch_size: int = op.DEFAULT_BATCH_SIZE,
        progress: op.Progress | None = None,
    ) -> UpsertResponse:
        """Upsert by id in atomic batches; ``progress(n)`` after each batch."""
        return await self._drive(
            op.upsert_documents(collection, documents, batch_size, progress)
        )

    async def get_document(self, collection: str, doc_id: str) -> DocumentOut:
        """One stored document with its norm."""
        call = ep.GET_DOCUMENT(name=collection, doc_id=doc_id)
        return await self._drive(op.one(call))

    async def get_documents(
        self,
        collection: str,
        ids: Iterable[str],
        *,
        batch_size: int = op.DEFAULT_IDS_PER_REQUEST,
    ) -> list[DocumentOut]:
        """The stored documents among ``ids``, once each, in order (unknown skipped).

        One batch get (``POST .../documents/get``) per ``batch_size`` ids.
        """
        return await self._drive(op.get_documents(collection, ids, batch_size))

    async def delete_document(self, collection: str, doc_id: str) -> None:
        """Delete one document."""
        call = ep.DELETE_DOCUMENT(name=collection, doc_id=doc_id)
        await self._drive(op.one(call))

    async def update_document(
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
        return await self._drive(op.update_document(collection, doc_id, metadata, mode))

    async def update_documents(
        self,
        collection: str,
        updates: Mapping[str, Mapping[str, Any]],
        *,
        mode: MetadataMode = "merge",
    ) -> list[DocumentOut]:
        """New metadata by document id, in one request: every one changes or none.

        An unknown id raises ``NotFound`` (nothing changed); see :meth:`update_document`.
        """
        return await self._drive(op.update_documents(collection, updates, mode))

    async def delete_documents(
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
        return await self._drive(
            op.delete_documents(collection, ids, missing_ok, batch_size)
        )

    async def list_documents(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> DocumentPage:
        """One page in write order; pass ``next_cursor`` back until it is None."""
        return await self._drive(op.list_documents(collection, limit, cursor))

    async def iter_documents(
        self, collection: str, *, page_size: int | None = None
    ) -> AsyncIterator[DocumentOut]:
        """Every document in write order, one page (``page_size``) a request."""
        cursor: str | None = None
        while True:
            page = await self.list_documents(collection, limit=page_size, cursor=cursor)
            for document in page.data:
                yield document
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def query_documents(
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
        return await self._drive(op.query_documents(collection, filter, limit, cursor))

    async def iter_documents_where(
        self,
        collection: str,
        filter: op.Filter | None = None,
        *,
        page_size: int | None = None,
    ) -> AsyncIterator[DocumentOut]:
        """Every document matching ``filter``, in write order, a page a request."""
        cursor: str | None = None
        while True:
            page = await self.query_documents(
                collection, filter, limit=page_size, cursor=cursor
            )
            for document in page.data:
                yield document
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def count_documents(
        self, collection: str, filter: op.Filter | None = None
    ) -> int:
        """How many documents match ``filter`` (every document without one)."""
        return await self._drive(op.count_documents(collection, filter))

    async def batch_get_documents(
        self, collection: str, ids: Iterable[str]
    ) -> DocumentsFound:
        """Several documents in one request; unknown ids come back in ``missing``."""
        return await self._drive(op.batch_get_documents(collection, ids))

    async def delete_documents_where(
        self,
        collection: str,
        filter: op.Filter | None = None,
        *,
        all: bool = False,
    ) -> int:
        """Delete by metadata equality (or everything with ``all=True``); the count."""
        return await self._drive(op.delete_documents_where(collection, filter, all))

    async def export_documents(self, collection: str) -> AsyncIterator[str]:
        """The collection's JSONL lines (no newline), streamed as the server sends.

        An unknown collection raises on the first line asked for.
        """
        async with self._export(collection) as response:
            async for line in response.aiter_lines():
                yield line

    async def export_documents_to(
        self, collection: str, path: str | os.PathLike[str]
    ) -> int:
        """Stream the export into a file ``normcal ingest`` reads; the documents.

        Written to ``PATH.part`` and renamed into place once complete.
        """
        partial, final = atomic_paths(path)
        lines = 0
        async with self._export(collection) as response:
            with partial.open("wb") as file:
                async for chunk in response.aiter_bytes():
                    file.write(chunk)
                    lines += chunk.count(b"\n")
        os.replace(partial, final)
        return lines

    @contextlib.asynccontextmanager
    async def _export(self, collection: str) -> AsyncIterator[httpx.Response]:
        call = ep.EXPORT_DOCUMENTS(name=collection)
        response = await self._respond(call, stream=True)
        try:
            if not response.is_success:
                raise error_from_response(response)
            yield response
        finally:
            await response.aclose()

    # -- search
    async def search(
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
        return (await self._drive(plan))[0]

    async def search_batch(
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
        return await self._drive(plan)

    # -- rerank
    async def rerank(
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
        return await self._drive(
            op.rerank(query, documents, top_n, collection, return_documents)
        )

    # -- calibrators
    async def fit_calibrator(
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
        return await self._drive(op.one(ep.FIT_CALIBRATOR(body, name=collection)))

    async def start_fit(
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
        return await self._drive(op.one(ep.START_FIT_JOB(body, name=collection)))

    async def get_fit_job(self, collection: str, job_id: str) -> FitJob:
        """One fit job: status, progress, and the calibrator or the error."""
        call = ep.GET_FIT_JOB(name=collection, job_id=job_id)
        return await self._drive(op.one(call))

    async def list_fit_jobs(self, collection: str) -> list[FitJob]:
        """The collection's fit jobs, newest first."""
        return (await self._drive(op.one(ep.LIST_FIT_JOBS(name=collection)))).data

    async def wait_fit_job(
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
        return await self._drive(plan)

    async def list_calibrators(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> CalibratorList:
        """One page of calibrators, oldest first; pass ``next_cursor`` for the next one.

        The shipped default comes first; the reports are not listed
        (``get_calibrator`` has one).
        """
        return await self._drive(op.list_calibrators(collection, limit, cursor))

    async def iter_calibrators(
        self, collection: str, *, page_size: int | None = None
    ) -> AsyncIterator[CalibratorSummary]:
        """Every calibrator of a collection, oldest first, one page a request."""
        cursor: str | None = None
        while True:
            page = await self.list_calibrators(
                collection, limit=page_size, cursor=cursor
            )
            for calibrator in page.data:
                yield calibrator
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """One calibrator with its cross-validation metrics and norm lift."""
        call = ep.GET_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def activate_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Make a calibrator the one search uses."""
        call = ep.ACTIVATE_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def calibrator_drift(
        self, collection: str, calibrator_id: str
    ) -> DriftReport:
        """Whether the queries it served lately look like those it was judged on."""
        call = ep.CALIBRATOR_DRIFT(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def reliability_png(self, collection: str, calibrator_id: str) -> bytes:
        """The reliability diagram (PNG bytes)."""
        call = ep.RELIABILITY_PNG(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def calibrator_report(self, collection: str, calibrator_id: str) -> str:
        """The HTML report page."""
        call = ep.CALIBRATOR_REPORT(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def delete_calibrator(self, collection: str, calibrator_id: str) -> None:
        """Delete a fitted calibrator (not the active one, nor the default)."""
        call = ep.DELETE_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        await self._drive(op.one(call))

    async def export_calibrator(
        self, collection: str, calibrator_id: str
    ) -> CalibratorProfile:
        """A calibrator as portable JSON (``model_dump()`` it to store it)."""
        call = ep.EXPORT_CALIBRATOR(name=collection, calibrator_id=calibrator_id)
        return await self._drive(op.one(call))

    async def import_calibrator(
        self,
        collection: str,
        profile: CalibratorProfile | Mapping[str, Any],
        *,
        activate: bool | None = None,
    ) -> CalibratorInfo:
        """Add an exported calibrator under a new id (same embedding model only)."""
        return await self._drive(op.import_calibrator(collection, profile, activate))

    async def feedback(
        self, collection: str, judgments: Iterable[op.JudgmentLike]
    ) -> FeedbackResponse:
        """Store relevance judgments collected in production for the next fit."""
        return await self._drive(op.feedback(collection, judgments))

    async def list_feedback(
        self, collection: str, *, limit: int | None = None, cursor: str | None = None
    ) -> FeedbackPage:
        """One page of stored feedback; pass ``next_cursor`` for the next one."""
        return await self._drive(op.list_feedback(collection, limit, cursor))

    async def delete_feedback(
        self,
        collection: str,
        *,
        query: str | None = None,
        document_id: str | None = None,
    ) -> FeedbackDeleted:
        """Delete stored feedback (all, one query's, or one pair's); returns how many."""
        return await self._drive(op.delete_feedback(collection, query, document_id))

    # -- judging
    async def query_log(self, collection: str) -> QueryLogInfo:
        """The query log's settings and size."""
        return await self._drive(op.one(ep.GET_QUERY_LOG(name=collection)))

    async def set_query_log(
        self, collection: str, *, enabled: bool, retention: int | None = None
    ) -> QueryLogInfo:
        """Record (or stop recording) searched query texts, keeping ``retention``."""
        return await self._drive(op.set_query_log(collection, enabled, retention))

    async def add_judging_queries(
        self, collection: str, queries: Sequence[str]
    ) -> JudgingQueriesResponse:
        """Queue queries to judge before any logged one."""
        return await self._drive(op.add_judging_queries(collection, queries))

    async def next_to_judge(
        self, collection: str, *, k: int | None = None, query: str | None = None
    ) -> JudgingNext:
        """The next query to judge (or ``query``), its top hits and the progress."""
        return await self._drive(op.next_to_judge(collection, k, query))

    async def skip_query(self, collection: str, query: str) -> None:
        """Do not offer ``query`` for judging again."""
        await self._drive(op.skip_query(collection, query))

    async def undo_judgment(
        self, collection: str, query: str, document_id: str
    ) -> FeedbackDeleted:
        """Take back one judgment of ``query`` (the judging page's undo; a judge key may)."""
        return await self._drive(op.undo_judgment(collection, query, document_id))

    async def unskip_query(self, collection: str, query: str) -> None:
        """Offer a skipped ``query`` for judging again."""
        await self._drive(op.unskip_query(collection, query))

    async def judging_suggestions(
        self, collection: str, *, n: int | None = None
    ) -> JudgingSuggestions:
        """Keyword queries drawn from the documents, to start judging with."""
        return await self._drive(op.judging_suggestions(collection, n))
