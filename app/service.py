"""The service's use cases, independent of HTTP: embed, collections, documents, search.

Routers translate HTTP into calls here and touch nothing else: not the embedder, the
registry or the pool. The service reaches collections only through the methods of
``CollectionBackend`` and ``Registry`` (``app.collections.base``), never their store,
so it serves either backend. Every CPU-bound step runs in the bounded pool.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from app import __version__, judging, limits
from app.api.schemas.calibrators import (
    CalibratorImport,
    CalibratorInfo,
    CalibratorProfile,
    FeedbackDeleted,
    FeedbackPage,
    FitRequest,
    Judgment,
    MethodMetrics,
    StoredJudgment,
)
from app.api.schemas.collections import CalibratorRef, CollectionInfo, Guarantee
from app.api.schemas.documents import (
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentsDeleted,
    DocumentsDeleteRequest,
    DocumentsFound,
    UpsertResponse,
)
from app.api.schemas.embed import Embedding, EmbedResponse
from app.api.schemas.health import (
    ModelIdentity,
    Readiness,
    ShippedProfileInfo,
    UnavailableCollection,
    VersionInfo,
)
from app.api.schemas.jobs import FitJob
from app.api.schemas.judging import (
    JudgingHit,
    JudgingNext,
    JudgingProgress,
    QueryLogInfo,
    QueryLogSettings,
)
from app.api.schemas.search import QueryInfo, SearchHit, SearchRequest, SearchResult
from app.api.schemas.snapshots import SnapshotInfo
from app.collections.base import CollectionBackend, Registry
from app.collections.registry import CollectionRegistry, Pool
from app.collections.snapshots import Snapshot, Snapshots
from app.collections.store import DEFAULT_STEMMER, NewDocument, StoredDocument
from app.concurrency import CpuPool
from app.embedding import Embedder, EmbeddingBatch, InputType
from app.embedding.batching import EmbedBatcher
from app.exceptions import (
    BackendUnsupportedError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from app.jobs import JOBS_FILE, FitJobs, Progress
from app.ops.observability import Metrics
from app.ops.report import reliability_png
from app.paging import decode_cursor, encode_cursor
from app.profiles import shipped_profiles
from app.settings import Settings
from calibration.exceptions import CalibrationError
from calibration.prior import CrossDomainPrior
from calibration.profile import Profile, QueryEvidence, fit_profile, to_jsonable

logger = logging.getLogger(__name__)

DEFAULT_K = 10  # hits per search
DEFAULT_FIT_K = 20  # retrieval depth of the pairs a calibrator is fitted on
# Default depth of the dense and BM25 lists a search draws candidates from: the depth
# calibrators are fitted at, so served pools look like the fitted ones.
POOL_DEPTH = DEFAULT_FIT_K
DEFAULT_PAGE_SIZE = 100  # items per page of a listing without a limit
EXPORT_CHUNK = 500  # documents read (and sent) per chunk of an export
NO_DEFAULT_REASON = "no calibration profile ships for this embedding model"


@dataclass
class Service:
    """Everything a request needs, owned by the app's lifespan."""

    settings: Settings
    embedder: Embedder
    registry: Registry[Profile]
    pool: CpuPool
    default_profile: Profile | None = None
    # Why no shipped profile serves this model (``app.profiles.load_default_profile``).
    no_default_reason: str = NO_DEFAULT_REASON
    # Prometheus metrics of the app; the calibrator fit calls metrics.observe_fit.
    metrics: Metrics | None = None
    # Only the local backend has snapshots (files of SQLite's online backup).
    snapshots: Snapshots | None = field(init=False)
    # Every embedding goes through it, so concurrent requests share forward passes.
    batcher: EmbedBatcher = field(init=False)
    fit_jobs: FitJobs = field(init=False)

    def __post_init__(self) -> None:
        self.snapshots = (
            Snapshots(self.registry)
            if isinstance(self.registry, CollectionRegistry)
            else None
        )
        self.fit_jobs = FitJobs(
            self.settings.data_dir / JOBS_FILE, self.settings.limits
        )
        self.batcher = EmbedBatcher(
            self.embedder,
            self.pool,
            max_texts=self.settings.embed_batch_size,
            window=self.settings.embed_batch_window_ms / 1000,
            max_queued=self.settings.max_pending_jobs,
            enabled=self.settings.embed_batching,
        )

    # -- health -----------------------------------------------------------------------
    def readiness(self, *, detailed: bool) -> Readiness:
        """Whether the service can take writes; ``status`` is ``"not ready"`` if not.

        Only a ``detailed`` answer (for a caller holding the API key, or when there
        is none) counts and names collections and says which path is unwritable.
        """
        storage = self.registry.storage_problem()
        broken = self.registry.unavailable()
        reasons: list[str] = []
        if storage is not None:
            reasons.append(
                storage
                if detailed
                else "the data dir is not writable"
                if self.registry.backend == "local"
                else f"the {self.registry.backend} storage does not answer"
            )
        if broken:
            reasons.append(f"{len(broken)} collection(s) unavailable")
        answer = Readiness(
            status="not ready" if storage else "degraded" if broken else "ready",
            model=self.embedder.model_name,
            dim=self.embedder.dim,
            reasons=reasons,
        )
        if detailed:
            answer.collections = len(self.registry.names())
            answer.unavailable = [
                UnavailableCollection(name=u.name, reason=u.reason) for u in broken
            ]
        return answer

    def version(self) -> VersionInfo:
        """The normcal version, the serving model's identity, the shipped profiles."""
        return VersionInfo(
            normcal=__version__,
            model=ModelIdentity(
                name=self.embedder.model_name,
                id=self.embedder.model_id,
                path=self.settings.model_path,
            ),
            profiles=[
                ShippedProfileInfo(name=p.name, format=p.format, model_id=p.model_id)
                for p in shipped_profiles()
            ],
        )

    def render_metrics(self) -> bytes:
        """The Prometheus exposition (404 when the app was built without metrics)."""
        if self.metrics is None:
            raise NotFoundError("endpoint", "/metrics")
        return self.metrics.render()

    # -- embedding --------------------------------------------------------------------
    async def embed(self, texts: list[str], input_type: InputType) -> EmbedResponse:
        """Embed texts after checking the batch and text limits."""
        lim = self.settings.limits
        limits.check_count("texts", texts, lim.max_texts_per_request)
        limits.check_texts("texts", texts, lim)
        batch = await self.batcher.embed(texts, input_type)
        return EmbedResponse(
            data=[
                Embedding(
                    embedding=batch.vectors[i].tolist(),
                    norm=float(batch.norms[i]),
                    n_tokens=int(batch.n_tokens[i]),
                    truncated=bool(batch.truncated[i]),
                )
                for i in range(len(batch))
            ],
            model=self.embedder.model_name,
            dim=self.embedder.dim,
        )

    # -- collections ------------------------------------------------------------------
    def create_collection(
        self, name: str, description: str, stemmer: str = DEFAULT_STEMMER
    ) -> CollectionInfo:
        """Create an empty collection and describe it (no second lookup to race)."""
        collection = self.registry.create(
            name,
            description=description,
            index_type=self.settings.index_type,
            stemmer=stemmer,
        )
        return self._describe(collection)

    def describe(self, name: str) -> CollectionInfo:
        """Describe a collection (503 if it is quarantined)."""
        return self._describe(self.registry.get(name))

    def _describe(self, collection: CollectionBackend[Profile]) -> CollectionInfo:
        documents, lexical_indexed, indexed = collection.counts()
        meta = collection.meta
        return CollectionInfo(
            name=collection.name,
            description=str(meta.get("description", "")),
            model=str(meta["model"]),
            model_id=meta.get("model_id"),
            dim=int(meta["dim"]),
            index_type=collection.index_type,
            documents=documents,
            indexed=indexed,
            lexical_indexed=lexical_indexed,
            stemmer=str(meta.get("stemmer", DEFAULT_STEMMER)),
            created_at=float(meta["created_at"]),
            calibrator=self._calibrator_ref(self._profile_for(collection)),
        )

    def list_collections(self) -> list[CollectionInfo]:
        """Describe every collection, the quarantined ones with their reason.

        A collection dropped while the list is built is left out, never an error.
        """
        out = [
            CollectionInfo(name=u.name, status="unavailable", reason=u.reason)
            for u in self.registry.unavailable()
        ]
        for name in self.registry.names():
            try:
                out.append(self.describe(name))
            except NotFoundError:
                continue
        return sorted(out, key=lambda info: info.name)

    def drop_collection(self, name: str) -> None:
        """Delete a collection and its files."""
        self.registry.drop(name)

    # -- snapshots --------------------------------------------------------------------
    def create_snapshot(self, name: str) -> SnapshotInfo:
        """Back a served collection up while writes go on."""
        return _snapshot_info(self._snapshots(name).create(name))

    def list_snapshots(self, name: str) -> list[SnapshotInfo]:
        """A collection's snapshots, oldest first."""
        return [_snapshot_info(s) for s in self._snapshots(name).list(name)]

    def snapshot_file(self, name: str, snapshot_id: str) -> Path:
        """The file of one snapshot, for download."""
        return self._snapshots(name).path(name, snapshot_id)

    def delete_snapshot(self, name: str, snapshot_id: str) -> None:
        """Delete one snapshot."""
        self._snapshots(name).delete(name, snapshot_id)

    def restore_snapshot(self, name: str, snapshot_id: str) -> CollectionInfo:
        """Replace a collection (served or quarantined) by one of its snapshots."""
        return self._describe(self._snapshots(name).restore(name, snapshot_id))

    def _snapshots(self, name: str) -> Snapshots:
        """The snapshots; off the local backend, a 404 for an unknown collection, else 422."""
        if self.snapshots is None:
            self.registry.get(name)
            raise BackendUnsupportedError(
                self.registry.backend,
                "has no snapshots: back its data up with the engine's own tools "
                "(for Milvus: milvus-backup)",
            )
        return self.snapshots

    # -- documents --------------------------------------------------------------------
    async def upsert(self, name: str, documents: list[DocumentIn]) -> UpsertResponse:
        """Embed and durably write documents; returns once the commit is done."""
        lim = self.settings.limits
        limits.check_count("documents", documents, lim.max_documents_per_upsert)
        ids = [d.id for d in documents]
        for i, doc in enumerate(documents):
            limits.check_value(f"documents.{i}.id", len(doc.id), lim.max_id_chars)
            limits.check_metadata(f"documents.{i}.metadata", doc.metadata, lim)
        limits.check_texts("documents.text", [d.text for d in documents], lim)
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise InvalidRequestError(
                f"document id {dup!r} appears more than once in the batch",
                field="documents",
            )
        collection = self.registry.get_compatible(name)
        batch = await self.batcher.embed([d.text for d in documents], "document")
        rows = [
            NewDocument(
                id=d.id,
                text=d.text,
                metadata=d.metadata,
                vector=batch.vectors[i],
                norm=float(batch.norms[i]),
                n_tokens=int(batch.n_tokens[i]),
                truncated=bool(batch.truncated[i]),
            )
            for i, d in enumerate(documents)
        ]
        await self.pool.run(collection.upsert, rows)
        return UpsertResponse(
            upserted=len(rows),
            ids=ids,
            truncated=[r.id for r in rows if r.truncated],
        )

    def get_document(self, name: str, doc_id: str) -> DocumentOut:
        """Read one document."""
        return _document_out(self.registry.get(name).get(doc_id))

    async def delete_document(self, name: str, doc_id: str) -> None:
        """Delete one document."""
        collection = self.registry.get(name)
        await self.pool.run(collection.delete, doc_id)

    def list_documents(
        self, name: str, limit: int | None, cursor: str | None
    ) -> DocumentPage:
        """A page of documents in write order (see ``DocumentPage``)."""
        lim = self.settings.limits
        size = limit if limit is not None else min(DEFAULT_PAGE_SIZE, lim.max_page_size)
        limits.check_value("limit", size, lim.max_page_size)
        after = decode_cursor(cursor) if cursor is not None else 0
        # One more than asked tells whether another page follows.
        docs = self.registry.get(name).page(after, size + 1)
        more = len(docs) > size
        docs = docs[:size]
        return DocumentPage(
            data=[_document_out(d) for d in docs],
            count=len(docs),
            next_cursor=encode_cursor(docs[-1].seq) if more else None,
        )

    def get_documents(self, name: str, ids: list[str]) -> DocumentsFound:
        """The documents among ``ids`` in request order (once each), and the missing."""
        limits.check_count("ids", ids, self.settings.limits.max_ids_per_get)
        wanted = list(dict.fromkeys(ids))
        found = self.registry.get(name).get_many(wanted)
        data = [_document_out(found[i]) for i in wanted if i in found]
        return DocumentsFound(
            data=data, count=len(data), missing=[i for i in wanted if i not in found]
        )

    async def delete_documents(
        self, name: str, body: DocumentsDeleteRequest
    ) -> DocumentsDeleted:
        """Delete the documents named by ``ids``, matching ``filter``, or all."""
        if [body.ids is not None, bool(body.filter), body.all].count(True) != 1:
            raise InvalidRequestError(
                'give exactly one of "ids", a non-empty "filter", or "all": true '
                "(to delete every document)",
                field="filter",
            )
        collection = self.registry.get(name)
        if body.ids is not None:
            limits.check_count("ids", body.ids, self.settings.limits.max_ids_per_get)
            deleted = await self.pool.run(collection.delete_ids, body.ids)
        else:
            deleted = await self.pool.run(collection.delete_where, body.filter)
        return DocumentsDeleted(deleted=deleted)

    def export_documents(self, name: str) -> AsyncIterator[bytes]:
        """The collection as JSONL (``{"id","text","metadata"}`` a line), in chunks.

        The collection is looked up now, so an unknown one is a 404 before the
        response starts; the chunks are then read page by page (each under its own
        read lock, like ``list_documents``), never the whole collection at once.
        """
        return self._export(self.registry.get(name))

    async def _export(
        self, collection: CollectionBackend[Profile]
    ) -> AsyncIterator[bytes]:
        after = 0
        while docs := await self.pool.run(collection.page, after, EXPORT_CHUNK):
            yield "".join(
                json.dumps(
                    {"id": d.id, "text": d.text, "metadata": d.metadata},
                    ensure_ascii=False,
                )
                + "\n"
                for d in docs
            ).encode()
            after = docs[-1].seq

    # -- search -----------------------------------------------------------------------
    async def search(self, name: str, request: SearchRequest) -> list[SearchResult]:
        """Embed the queries; return each one's top-k hits with probabilities."""
        lim = self.settings.limits
        texts = request.texts
        k = request.k if request.k is not None else min(DEFAULT_K, lim.max_k)
        limits.check_value("k", k, lim.max_k)
        n = request.candidates
        if n is None:  # never above max_k, so a small max_k still has a default
            n = min(max(k, POOL_DEPTH), lim.max_k)
        limits.check_value("candidates", n, lim.max_k)
        if n < k:
            raise InvalidRequestError(
                f"candidates ({n}) must be at least k ({k})", field="candidates"
            )
        limits.check_count("queries", texts, lim.max_queries_per_search)
        limits.check_texts("queries" if request.queries else "query", texts, lim)
        collection = self.registry.get_compatible(name)
        profile = self._profile_for(collection)  # one snapshot for the whole request
        if profile is None and (
            request.min_probability is not None
            or request.target_precision is not None
            or request.mode == "hybrid"
        ):
            raise InvalidRequestError(
                "min_probability, target_precision and mode 'hybrid' need a "
                "calibrator; none is available for model "
                f"{self.embedder.model_name!r}",
                field="mode" if request.mode == "hybrid" else "min_probability",
            )
        batch = await self.batcher.embed(texts, "query")
        pools = await self.pool.run(
            collection.search, batch.vectors, texts, n, request.filter
        )
        results = await self.pool.run(
            _results, batch, pools, self._calibrator_ref(profile), profile, request, k
        )
        await self._log_queries(collection, texts)
        return results

    # -- calibrators ------------------------------------------------------------------
    async def fit_calibrator(self, name: str, body: FitRequest) -> CalibratorInfo:
        """Fit a calibrator and wait for it: a fit job awaited (one code path)."""
        job = self.start_fit(name, body)
        return await self.fit_jobs.wait(job.id)

    def start_fit(self, name: str, body: FitRequest) -> FitJob:
        """Check a fit request, then start it as a job; nothing changes until it ends.

        Every check that needs no fitting runs here, so a bad request is a 4xx with
        no job; the job stores (and activates) the calibrator only if the fit works.
        """
        lim = self.settings.limits
        limits.check_count("judgments", body.judgments, lim.max_judgments_per_fit)
        limits.check_texts("judgments.query", [j.query for j in body.judgments], lim)
        k = body.k if body.k is not None else min(DEFAULT_FIT_K, lim.max_k)
        limits.check_value("k", k, lim.max_k)
        collection = self.registry.get_compatible(name)
        judged = [(j.query, j.document_id, j.relevance) for j in body.judgments]
        if body.include_feedback:
            judged += collection.judgments()
        if not judged:
            raise InvalidRequestError(
                "no judgments: send some, or POST feedback first", field="judgments"
            )
        self._check_documents_exist(collection, [d for _, d, _ in judged])
        qrels: dict[str, dict[str, int]] = {}
        for query, doc_id, relevance in judged:
            qrels.setdefault(query, {})[doc_id] = relevance
        return self.fit_jobs.submit(
            name, lambda progress: self._fit(collection, body, qrels, k, progress)
        )

    async def _fit(
        self,
        collection: CollectionBackend[Profile],
        body: FitRequest,
        qrels: dict[str, dict[str, int]],
        k: int,
        progress: Progress,
    ) -> CalibratorInfo:
        """The fit of a job, reporting each stage it enters to ``progress``."""
        name = collection.name
        progress("embedding queries")
        queries = sorted(qrels)
        batch = await self.batcher.embed(queries, "query")
        progress("retrieving")
        pools = await self.pool.run(collection.search, batch.vectors, queries, k, None)
        progress("fitting")
        evidence = [
            QueryEvidence(
                norm=float(batch.norms[i]),
                n_tokens=int(batch.n_tokens[i]),
                scores=np.array([h.score for h in pool.hits]),
                doc_norms=np.array([h.document.norm for h in pool.hits]),
                doc_tokens=np.array(
                    [h.document.n_tokens for h in pool.hits], dtype=np.int64
                ),
                labels=np.array(
                    [float(qrels[q].get(h.document.id, 0) > 0) for h in pool.hits]
                ),
                lexical=pool.lexical,
            )
            for i, (q, pool) in enumerate(zip(queries, pools, strict=True))
        ]
        doc_norms, doc_tokens = collection.norm_sample()
        started = time.perf_counter()
        profile = await self.pool.run(
            fit_profile,
            evidence,
            doc_norms=doc_norms,
            doc_tokens=doc_tokens,
            model=self.embedder.model_name,
            model_id=self.embedder.model_id,
            method=body.method,
            allow_reorder=body.allow_reorder,
            abstain_target=body.abstain_target,
            abstain_delta=body.abstain_delta,
            extra_report={"collection": name},
            prior=self._shipped_prior(),
        )
        seconds = time.perf_counter() - started
        logger.info(
            "fitted calibrator %s (%s) on %s in %.2fs",
            profile.id,
            profile.method,
            name,
            seconds,
        )
        if self.metrics is not None:
            self.metrics.observe_fit(seconds, method=profile.method)
        progress("storing")
        await self.pool.run(collection.add_calibrator, profile, activate=body.activate)
        return self._info(collection, profile)

    def get_fit_job(self, name: str, job_id: str) -> FitJob:
        """One fit job of a collection."""
        self.registry.get(name)
        return self.fit_jobs.get(name, job_id)

    def list_fit_jobs(self, name: str) -> list[FitJob]:
        """A collection's fit jobs, newest first."""
        self.registry.get(name)
        return self.fit_jobs.list(name)

    def list_calibrators(self, name: str) -> list[CalibratorInfo]:
        """Every calibrator of a collection, oldest first.

        The shipped default comes first when it was fitted for the collection's model.
        """
        collection = self.registry.get(name)
        default = self._default_for(collection)
        shipped = [] if default is None else [default]
        return [
            self._info(collection, p) for p in [*shipped, *collection.calibrators()]
        ]

    def get_calibrator(self, name: str, calibrator_id: str) -> CalibratorInfo:
        """One calibrator's report."""
        collection = self.registry.get(name)
        return self._info(collection, self.profile(name, calibrator_id))

    def profile(self, name: str, calibrator_id: str) -> Profile:
        """A collection's calibrator, or the default profile by its id.

        The default is one of a collection's calibrators only when it was fitted for
        the collection's model; otherwise its id is as unknown as any other.
        """
        collection = self.registry.get(name)
        default = self._default_for(collection)
        if default is not None and calibrator_id == default.id:
            return default
        return collection.calibrator(calibrator_id)

    async def reliability_png(self, name: str, calibrator_id: str) -> bytes:
        """A calibrator's reliability diagram (drawing it is CPU work for the pool)."""
        return await self.pool.run(reliability_png, self.profile(name, calibrator_id))

    async def activate_calibrator(
        self, name: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Serve a stored calibrator, or the shipped default, from now on."""
        collection = self.registry.get_compatible(name)
        default = self._default_for(collection)
        if default is not None and calibrator_id == default.id:
            await self.pool.run(collection.deactivate)
            return self._info(collection, default)
        profile = await self.pool.run(collection.activate, calibrator_id)
        return self._info(collection, profile)

    async def delete_calibrator(self, name: str, calibrator_id: str) -> None:
        """Delete a fitted calibrator; the active one and the default are refused."""
        collection = self.registry.get(name)
        default = self._default_for(collection)
        if default is not None and calibrator_id == default.id:
            raise ConflictError(
                f"calibrator {calibrator_id!r} is the shipped default of model "
                f"{default.model!r}; it ships with the service and cannot be deleted"
            )
        await self.pool.run(collection.delete_calibrator, calibrator_id)

    def export_calibrator(self, name: str, calibrator_id: str) -> CalibratorProfile:
        """A calibrator (the default too) as portable profile JSON."""
        profile = self.profile(name, calibrator_id)
        return CalibratorProfile.model_validate(profile.to_json())

    async def import_calibrator(
        self, name: str, body: CalibratorImport
    ) -> CalibratorInfo:
        """Add an exported profile to a collection under a new id.

        Refused (422, nothing stored) when the profile is not one this service can
        read or score with, or was fitted for another embedding model: its maps are
        only meaningful on that model's cosines and norms. The model is told by name
        and, when the profile recorded one, by the identity of its files.
        """
        collection = self.registry.get_compatible(name)
        model = collection.meta["model"]
        if body.profile.get("model") != model:
            raise InvalidRequestError(
                f"the profile was fitted for embedding model "
                f"{body.profile.get('model')!r}; collection {name!r} uses {model!r}",
                field="profile.model",
            )
        recorded = body.profile.get("model_id")
        if recorded is not None and recorded != self.embedder.model_id:
            raise InvalidRequestError(
                f"the profile was fitted for model files of identity {recorded!r}; "
                f"the model served as {model!r} has identity "
                f"{self.embedder.model_id!r} (see GET /version)",
                field="profile.model_id",
            )
        imported = await self.pool.run(_imported_profile, body.profile)
        await self.pool.run(collection.add_calibrator, imported, activate=body.activate)
        return self._info(collection, imported)

    def add_feedback(self, name: str, judgments: list[Judgment]) -> tuple[int, int]:
        """Store judgments for the next fit; returns ``(stored, total)``."""
        lim = self.settings.limits
        limits.check_count("judgments", judgments, lim.max_judgments_per_fit)
        limits.check_texts("judgments.query", [j.query for j in judgments], lim)
        collection = self.registry.get(name)
        self._check_documents_exist(collection, [j.document_id for j in judgments])
        total = collection.add_judgments(
            [(j.query, j.document_id, j.relevance) for j in judgments]
        )
        return len(judgments), total

    def list_feedback(
        self, name: str, limit: int | None, cursor: str | None
    ) -> FeedbackPage:
        """A page of stored feedback after ``cursor``, oldest first.

        The cursor is that of document listings (``app.paging``) over the
        judgments' ``n``, a position later additions and deletions cannot move.
        """
        largest = self.settings.limits.max_page_size
        size = limit if limit is not None else min(DEFAULT_PAGE_SIZE, largest)
        limits.check_value("limit", size, largest)
        after = decode_cursor(cursor) if cursor is not None else 0
        # One more than asked tells whether another page follows.
        rows = self.registry.get(name).judgments_page(size + 1, after)
        more = len(rows) > size
        data = [
            StoredJudgment(query=q, document_id=d, relevance=r, created_at=t)
            for _, q, d, r, t in rows[:size]
        ]
        last = rows[size - 1][0] if more else None
        return FeedbackPage(
            data=data,
            count=len(data),
            next_cursor=None if last is None else encode_cursor(last),
        )

    def delete_feedback(self, name: str, query: str | None) -> FeedbackDeleted:
        """Delete stored feedback: all of it, or one query's judgments."""
        collection = self.registry.get(name)
        return FeedbackDeleted(deleted=collection.delete_judgments(query))

    # -- judging loop ------------------------------------------------------------------
    def query_log(self, name: str) -> QueryLogInfo:
        """The collection's query log settings and size (off unless enabled)."""
        collection = self.registry.get(name)
        current = _query_log_settings(collection)
        return QueryLogInfo(**current.model_dump(), entries=collection.query_log_size())

    def set_query_log(self, name: str, body: QueryLogSettings) -> QueryLogInfo:
        """Turn the query log on or off and set its retention (applied at once).

        Turning it off stops recording; the logged queries stay judging candidates.
        """
        retention_limit = self.settings.limits.max_query_log_retention
        limits.check_value("retention", body.retention, retention_limit)
        collection = self.registry.get(name)
        collection.set_meta(query_log=body.model_dump())
        entries = collection.trim_query_log(body.retention)
        return QueryLogInfo(**body.model_dump(), entries=entries)

    async def _log_queries(
        self, collection: CollectionBackend[Profile], texts: list[str]
    ) -> None:
        """Record searched texts when the log is on; a failure only gets logged."""
        current = _query_log_settings(collection)
        if not current.enabled:
            return
        try:
            await self.pool.run(collection.log_queries, texts, current.retention)
        except Exception:  # the search was answered; the log is best effort
            logger.warning(
                "could not log queries of %s", collection.name, exc_info=True
            )

    def add_judging_queries(self, name: str, queries: list[str]) -> int:
        """Queue queries to judge ahead of logged ones; returns how many were new."""
        lim = self.settings.limits
        limits.check_count("queries", queries, lim.max_judging_queries)
        limits.check_texts("queries", queries, lim)
        return self.registry.get(name).add_judging_queries(queries)

    def skip_judging(self, name: str, query: str) -> None:
        """Never offer ``query`` for judging again (404 if it is not a candidate)."""
        if not self.registry.get(name).skip_judging(query):
            raise NotFoundError("judging query", query)

    async def next_to_judge(self, name: str, k: int) -> JudgingNext:
        """The next query to judge with its top ``k`` hits (see ``app.judging``)."""
        limits.check_value("k", k, self.settings.limits.max_k)
        collection = self.registry.get_compatible(name)
        source, candidates, remaining = collection.judging_candidates(
            judging.CANDIDATE_POOL
        )
        judged, relevant, skipped = collection.judging_counts()
        progress = JudgingProgress(
            judged_queries=judged,
            relevant_queries=relevant,
            target=judging.FIT_MIN_QUERIES,
            remaining=remaining,
            skipped=skipped,
            can_fit=judged >= judging.FIT_MIN_QUERIES and relevant > 0,
        )
        profile = self._profile_for(collection)
        if not candidates:
            return JudgingNext(
                query=None,
                source="none",
                confidence=None,
                hits=[],
                calibrator=self._calibrator_ref(profile),
                progress=progress,
            )
        request = SearchRequest(queries=candidates, k=k, include_text=True)
        batch = await self.batcher.embed(candidates, "query")
        pools = await self.pool.run(
            collection.search, batch.vectors, candidates, max(k, POOL_DEPTH), None
        )
        results = await self.pool.run(
            _results, batch, pools, self._calibrator_ref(profile), profile, request, k
        )
        levels = [
            r.confidence
            if r.confidence is not None
            else (r.hits[0].score if r.hits else 0.0)  # no calibrator: the top cosine
            for r in results
        ]
        chosen = judging.pick(levels, turn=judged + skipped)
        result = results[chosen]
        return JudgingNext(
            query=candidates[chosen],
            source="uploaded" if source == "uploaded" else "log",
            confidence=result.confidence,
            hits=[
                JudgingHit(
                    id=h.id, text=h.text or "", score=h.score, probability=h.probability
                )
                for h in result.hits
            ],
            calibrator=result.calibrator,
            progress=progress,
        )

    def _check_documents_exist(
        self, collection: CollectionBackend[Profile], ids: list[str]
    ) -> None:
        unknown = collection.missing(ids)
        if unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InvalidRequestError(
                f"judgments name documents that are not in collection "
                f"{collection.name!r}: {shown}{more}",
                field="judgments",
            )

    def _shipped_prior(self) -> CrossDomainPrior | None:
        """The cross-domain prior of the shipped default profile (for few-label fits)."""
        default = self.default_profile
        if default is None or default.model != self.embedder.model_name:
            return None
        return default.prior

    def _profile_for(self, collection: CollectionBackend[Profile]) -> Profile | None:
        if collection.profile is not None:
            return collection.profile
        return self._default_for(collection)

    def _default_for(self, collection: CollectionBackend[Profile]) -> Profile | None:
        """The shipped default profile, if it was fitted for the collection's model."""
        default = self.default_profile
        if default is not None and default.model == collection.meta.get("model"):
            return default
        return None

    def _calibrator_ref(self, profile: Profile | None) -> CalibratorRef:
        return _calibrator_ref(profile, self.no_default_reason)

    def _info(
        self, collection: CollectionBackend[Profile], profile: Profile
    ) -> CalibratorInfo:
        active = self._profile_for(collection)
        report = profile.report
        abstain = None if report.abstain is None else to_jsonable(report.abstain)
        return CalibratorInfo(
            id=profile.id,
            collection=None if profile.default else collection.name,
            method=profile.method,
            created_at=profile.created_at,
            active=active is not None and active.id == profile.id,
            default=profile.default,
            reorders_hits=profile.reorders_hits,
            cv={m: MethodMetrics(**to_jsonable(s)) for m, s in report.cv.items()},
            norm_lift=to_jsonable(report.norm_lift),
            abstain=abstain,
            report=report.to_jsonable(),
        )


def _snapshot_info(snapshot: Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        id=snapshot.id,
        collection=snapshot.collection,
        created_at=snapshot.created_at,
        documents=snapshot.documents,
        bytes=snapshot.bytes,
    )


def _document_out(doc: StoredDocument) -> DocumentOut:
    """A stored document as the wire shows it."""
    return DocumentOut.model_validate(doc, from_attributes=True)


def _imported_profile(data: dict[str, Any]) -> Profile:
    """Decode an exported profile and give it a new id in this collection.

    Any decoding failure, and a profile that cannot score a query, is a 422:
    stored, it would break every later search.
    """
    try:
        profile = Profile.from_json(data)
        profile.score(
            1.0,
            8,
            np.array([0.5, 0.1]),
            np.array([1.0, 1.0]),
            np.array([8, 8], dtype=np.int64),
        )
    except CalibrationError as error:
        raise InvalidRequestError(
            f"not a valid calibration profile: {error}", field="profile"
        ) from error
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise InvalidRequestError(
            f"not a valid calibration profile ({type(error).__name__}: {error})",
            field="profile",
        ) from error
    return replace(
        profile, id=uuid.uuid4().hex[:12], created_at=time.time(), default=False
    )


def _query_log_settings(collection: CollectionBackend[Profile]) -> QueryLogSettings:
    """The stored query log settings (the defaults, off, when never set)."""
    return QueryLogSettings.model_validate(collection.meta.get("query_log", {}))


def _results(
    batch: EmbeddingBatch,
    pools: list[Pool],
    ref: CalibratorRef,
    profile: Profile | None,
    request: SearchRequest,
    k: int,
) -> list[SearchResult]:
    """Score each query's pool, pick its hits by mode, then apply the cuts.

    ``ref`` describes ``profile`` (the same for every query of the request).
    """
    return [
        _result(batch, i, pool, ref, profile, request, k)
        for i, pool in enumerate(pools)
    ]


def _result(
    batch: EmbeddingBatch,
    i: int,
    pool: Pool,
    ref: CalibratorRef,
    profile: Profile | None,
    request: SearchRequest,
    k: int,
) -> SearchResult:
    """One query's answer.

    The whole pool is scored once, so a document's probability for a query is the
    same number whichever mode returned it; the mode alone picks and orders the hits:
    dense by cosine, lexical by BM25, hybrid by probability.
    """
    norm, n_tokens = float(batch.norms[i]), int(batch.n_tokens[i])
    hits = pool.hits
    out = [
        SearchHit(
            id=h.document.id,
            score=h.score,
            bm25=float(pool.lexical.bm25[j]),
            probability=None,
            norm=h.document.norm,
            n_tokens=h.document.n_tokens,
            metadata=h.document.metadata,
            text=h.document.text if request.include_text else None,
        )
        for j, h in enumerate(hits)
    ]
    scored = None
    if profile is not None:
        scored = profile.score(
            norm,
            n_tokens,
            np.array([h.score for h in hits]),
            np.array([h.document.norm for h in hits]),
            np.array([h.document.n_tokens for h in hits], dtype=np.int64),
            pool.lexical,
        )
        for j, (hit, p) in enumerate(zip(out, scored.probabilities, strict=True)):
            hit.probability = float(p)
            if scored.intervals is not None:
                lo, hi = scored.intervals
                hit.probability_interval = (float(lo[j]), float(hi[j]))
    if request.mode == "lexical":
        out = [out[j] for j in pool.lexical_top(k)]
    elif request.mode == "hybrid":
        out = sorted(out, key=lambda h: (-(h.probability or 0.0), -h.score))[:k]
    else:
        out = [out[j] for j in pool.dense_top(k)]
    confidence = abstain = band = None
    if profile is not None and scored is not None:
        out = _cut(out, request.min_probability, request.target_precision)
        # Confidence of the hits actually returned (after the cut).
        returned = profile.verdict(
            np.array([h.probability or 0.0 for h in out]),
            None
            if scored.intervals is None
            else (
                np.array([(h.probability_interval or (0.0, 0.0))[0] for h in out]),
                np.array([(h.probability_interval or (0.0, 0.0))[1] for h in out]),
            ),
        )
        confidence, abstain = returned.confidence, returned.abstain
        band = returned.confidence_interval
    return SearchResult(
        query=QueryInfo(
            norm=norm, n_tokens=n_tokens, truncated=bool(batch.truncated[i])
        ),
        mode=request.mode,
        hits=out,
        confidence=confidence,
        confidence_interval=band,
        abstain=abstain,
        calibrator=ref,
    )


def _calibrator_ref(profile: Profile | None, no_default_reason: str) -> CalibratorRef:
    """Status of the calibrator in use (see ``CalibratorRef``)."""
    if profile is None:
        return CalibratorRef(
            status="none",
            default=False,
            reason=f"{no_default_reason}; fit one from judgments "
            "(POST .../calibrators)",
        )
    policy = None if profile.default else profile.certified_policy
    return CalibratorRef(
        status="default" if profile.default else "fitted",
        id=profile.id,
        method=profile.method,
        default=profile.default,
        reorders_hits=profile.reorders_hits,
        n_queries=None if profile.default else profile.report.n_queries,
        guarantee=None
        if policy is None
        else Guarantee(
            target=policy.target_risk,
            delta=policy.delta,
            n_queries=policy.n_calibration,
        ),
    )


def _cut(
    hits: list[SearchHit], min_probability: float | None, target_precision: float | None
) -> list[SearchHit]:
    """Drop hits below ``min_probability``, then cut to ``target_precision``.

    The cut keeps the longest prefix whose mean probability (its expected
    precision) is at least ``target_precision``.
    """
    if min_probability is not None:
        hits = [h for h in hits if (h.probability or 0.0) >= min_probability]
    if target_precision is not None:
        probs = np.array([h.probability or 0.0 for h in hits])
        mean = np.cumsum(probs) / np.arange(1, len(probs) + 1)
        ok = np.flatnonzero(mean >= target_precision)
        hits = hits[: int(ok[-1]) + 1] if len(ok) else []
    return hits
