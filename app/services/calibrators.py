"""Calibrators of a collection and the feedback later fits use.

Calibrators: fit (as jobs), report, switch, delete, export, import. Feedback: the
stored judgments a fit can include.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np

from app.collections.base import (
    CalibratorEntry,
    CollectionBackend,
    check_calibrator_cap,
)
from app.embedding import EmbeddingBatch
from app.exceptions import ConflictError, InvalidRequestError
from app.schemas.calibrators import (
    CalibratorImport,
    CalibratorInfo,
    CalibratorList,
    CalibratorProfile,
    CalibratorSelection,
    CalibratorSummary,
    DriftReport,
    FeatureDrift,
    FeedbackDeleted,
    FeedbackPage,
    FitJudgments,
    FitRequest,
    JudgedDocument,
    JudgedList,
    Judgment,
    MethodMetrics,
    PositiveRate,
    StoredJudgment,
)
from app.schemas.jobs import FitJob
from app.services import limits, own_vectors
from app.services.context import DEFAULT_PAGE_SIZE, Context, Part, judging_step
from app.services.drift import reference_of
from app.services.jobs import Progress
from app.services.next_query import FIT_MIN_QUERIES
from app.services.paging import decode_cursor, encode_cursor
from app.services.rerank import RerankService, check_documents, input_scores
from app.settings import Limits
from app.ui.report import reliability_png
from calibration.exceptions import (
    InsufficientDataError,
    UnsupportedFormatError,
)
from calibration.prior import CrossDomainPrior
from calibration.profile import (
    Profile,
    QueryEvidence,
    fit_profile,
    to_jsonable,
    trial_scores,
)

logger = logging.getLogger(__name__)

DEFAULT_FIT_K = 20  # retrieval depth of the pairs a calibrator is fitted on
PNG_CACHE_ENTRIES = 64  # reliability diagrams kept (tens of KB each)


class CalibratorsService(Part):
    """Calibrators, fit jobs and feedback of a collection."""

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        # Reliability diagrams by (collection, calibrator id, created_at), newest last.
        self._png_cache: OrderedDict[tuple[str, str, float], bytes] = OrderedDict()
        # Serialises the count-then-store of feedback (its per-collection cap).
        self._feedback_lock = threading.Lock()
        self._rerank = RerankService(context)  # judged lists are embedded as reranked

    async def fit_calibrator(self, name: str, body: FitRequest) -> CalibratorInfo:
        """Fit a calibrator and wait for it: a fit job awaited (one code path)."""
        job = await self.start_fit(name, body)
        return await self.fit_jobs.wait(job.id)

    async def start_fit(self, name: str, body: FitRequest) -> FitJob:
        """Check a fit request, then start it as a job; nothing changes until it ends.

        Every check that needs no fitting runs here (limits, unknown documents, too
        few judged queries), so a bad request is a 4xx with no job, whether it came
        as a fit or a fit job; the job stores (and activates) the calibrator only if
        the fit works. Stored feedback is read in the pool, off the event loop.
        """
        lim = self.settings.limits
        limits.check_count("judgments", body.judgments, lim.max_judgments_per_fit)
        limits.check_texts("judgments.query", [j.query for j in body.judgments], lim)
        check_lists(body, lim)
        k = body.k if body.k is not None else min(DEFAULT_FIT_K, lim.max_k)
        limits.check_value("k", k, lim.max_k)
        collection = self.registry.get_compatible(name)
        self._check_room(collection)
        own_vectors.check_kind(
            collection, body.query_vectors is not None, "query_vectors"
        )
        if body.lists and own_vectors.is_own(collection):
            raise InvalidRequestError(
                f"collection {name!r} takes the client's own vectors; judged lists "
                "are embedded with the server's model",
                field="lists",
            )
        limits.check_count(
            "query_vectors", list(body.query_vectors or ()), lim.max_judgments_per_fit
        )
        qrels, inputs = await self.pool.run(self._fit_qrels, collection, body)
        logged = await self.pool.run(collection.state.rerank_lists, sorted(qrels))
        lists = [*body.lists, *(logged_list(q, logged[q][0], qrels[q]) for q in logged)]
        searched = {q: judged for q, judged in qrels.items() if q not in logged}
        batch = None  # the server's model embeds the queries in the job
        if body.query_vectors is not None:
            batch = await self.pool.run(
                self._own_query_batch, collection, sorted(searched), body.query_vectors
            )
        return self.fit_jobs.submit(
            name,
            lambda progress: self._fit(
                collection, body, (searched, lists), k, inputs, progress, batch
            ),
        )

    def _own_query_batch(
        self,
        collection: CollectionBackend[Profile],
        queries: list[str],
        vectors: dict[str, list[float]],
    ) -> EmbeddingBatch:
        """The judged queries' own vectors, in ``queries`` order (422 if one lacks one)."""
        missing = [q for q in queries if q not in vectors]
        if missing:
            shown = ", ".join(repr(q) for q in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise InvalidRequestError(
                f"query_vectors lacks the vector of judged queries {shown}{more}",
                field="query_vectors",
            )
        return own_vectors.vector_batch(
            [f"query_vectors.{q}" for q in queries],
            [vectors[q] for q in queries],
            int(collection.meta["dim"]),
            own_vectors.token_counts(self.embedder, list(queries)),
        )

    def _fit_qrels(
        self, collection: CollectionBackend[Profile], body: FitRequest
    ) -> tuple[dict[str, dict[str, int]], FitJudgments]:
        """The judgments a fit runs on, as qrels, and where they came from (blocking).

        The body plus (``include_feedback``) the stored feedback, at most
        ``max_judgments_per_fit`` in all; judgments naming unknown documents are an
        error or, with ``unknown_documents: "skip"``, dropped and counted.
        """
        limit = self.settings.limits.max_judgments_per_fit
        judged = [(j.query, j.document_id, j.relevance) for j in body.judgments]
        stored: list[tuple[str, str, int]] = []
        listed = sum(len(lst.documents) for lst in body.lists)
        if body.include_feedback:
            sent = len(judged) + listed

            def check_total(stored: int) -> None:
                limits.check_value(
                    "judgments",
                    sent + stored,
                    limit,
                    rule=f"{sent} sent plus {stored} stored as feedback; "
                    "limits.max_judgments_per_fit (send include_feedback: false, "
                    "or delete feedback)",
                )

            check_total(collection.state.judgments_count())  # before reading them all
            stored = collection.state.judgments()
            check_total(len(stored))  # feedback added in between
            judged += stored
        if not judged and not body.lists:
            raise InvalidRequestError(
                "no judgments: send some (or judged lists), or POST feedback first",
                field="judgments",
            )
        dropped = 0
        if body.unknown_documents == "skip":
            unknown = set(unknown_documents(collection, [(q, d) for q, d, _ in judged]))
            kept = [row for row in judged if row[1] not in unknown]
            dropped = len(judged) - len(kept)
            if not kept and not body.lists:
                raise InvalidRequestError(
                    f"no judgments left: all {dropped} name documents that are not "
                    f"in collection {collection.name!r}",
                    field="judgments",
                )
            judged = kept
        else:
            self._check_documents_exist(collection, [(q, d) for q, d, _ in judged])
        qrels: dict[str, dict[str, int]] = {}
        for query, doc_id, relevance in judged:
            qrels.setdefault(query, {})[doc_id] = relevance
        units = len(qrels) + len(body.lists)
        if units < FIT_MIN_QUERIES:
            raise InsufficientDataError(
                f"a fit needs judgments of at least {FIT_MIN_QUERIES} queries (one "
                f"per fold of its grouped cross-validation), got {units}",
                n_queries=units,
                required=FIT_MIN_QUERIES,
            )
        return qrels, FitJudgments(
            sent=len(body.judgments),
            sent_queries=len({j.query for j in body.judgments}),
            feedback=len(stored),
            feedback_queries=len({q for q, _, _ in stored}),
            dropped=dropped,
            lists=len(body.lists),
            queries=len(qrels) + len(body.lists),
        )

    async def _fit(
        self,
        collection: CollectionBackend[Profile],
        body: FitRequest,
        judged: tuple[dict[str, dict[str, int]], list[JudgedList]],
        k: int,
        inputs: FitJudgments,
        progress: Progress,
        batch: EmbeddingBatch | None = None,
    ) -> CalibratorInfo:
        """The fit of a job, reporting each stage it enters to ``progress``.

        ``judged``: the judged queries whose hits the collection retrieves, and the
        judged lists (sent, or logged rerank requests), fitted as they came.
        ``batch``: the queries' own vectors (in sorted order), on a collection of
        the client's own vectors; otherwise the server's model embeds them.
        """
        name = collection.name
        qrels, lists = judged
        progress("embedding queries")
        evidence = []
        for one in lists:
            documents = one.documents
            labels = np.array([float((d.relevance or 0) > 0) for d in documents])
            listed, _ = await self._rerank.score(
                collection,
                None,
                one.query,
                [d.text for d in documents],
                input_scores(documents),
                labels,
            )
            evidence.append(listed)
        if qrels:
            evidence += await self._search_evidence(
                collection, qrels, k, batch, progress
            )
        progress("fitting")
        doc_norms, doc_tokens = collection.norm_sample()
        if len(doc_norms) < NORM_SAMPLE_MIN:  # a namespace: its lists' documents
            doc_norms = np.concatenate([doc_norms, *(e.doc_norms for e in evidence)])
            doc_tokens = np.concatenate([doc_tokens, *(e.doc_tokens for e in evidence)])
        own = own_vectors.is_own(collection)
        started = time.perf_counter()
        profile = await self.pool.run(
            fit_profile,
            evidence,
            doc_norms=doc_norms,
            doc_tokens=doc_tokens,
            model=str(collection.meta["model"]),
            model_id=None if own else self.embedder.model_id,
            method=body.method,
            allow_reorder=body.allow_reorder,
            abstain_target=body.abstain_target,
            abstain_delta=body.abstain_delta,
            extra_report={"collection": name, "judged_lists": len(lists)},
            prior=self._shipped_prior(collection, lists=2 * len(lists) > len(evidence)),
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
        await self.pool.run(
            collection.state.add_calibrator,
            profile,
            activate=body.activate,
            cap=self.settings.limits.max_calibrators_per_collection,
        )
        return self._info(collection, profile, inputs=inputs)

    async def _search_evidence(
        self,
        collection: CollectionBackend[Profile],
        qrels: dict[str, dict[str, int]],
        k: int,
        batch: EmbeddingBatch | None,
        progress: Progress,
    ) -> list[QueryEvidence]:
        """The judged queries' hits as the collection retrieves them, labelled."""
        queries = sorted(qrels)
        if batch is None:
            # A fit job's queries are bulk work: searches go first.
            batch = await self.batcher.embed(queries, "query", priority="bulk")
        progress("retrieving")
        pools = await self.pool.run(collection.search, batch.vectors, queries, k)
        return [
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

    def get_fit_job(self, name: str, job_id: str) -> FitJob:
        """One fit job of a collection."""
        self.registry.get(name)
        return self.fit_jobs.get(name, job_id)

    def list_fit_jobs(self, name: str) -> list[FitJob]:
        """A collection's fit jobs, newest first."""
        self.registry.get(name)
        return self.fit_jobs.list(name)

    def list_calibrators(
        self, name: str, limit: int | None, cursor: str | None
    ) -> CalibratorList:
        """A page of a collection's calibrators, oldest first, without their reports.

        The shipped default comes first (on the first page) when it was fitted for
        the collection's model. The stored ones are read without their profiles
        (:meth:`CollectionState.calibrator_page`), so a page costs the same whatever
        the profiles weigh, and one stored before profiles were checked is listed
        (to be deleted) though it cannot serve; ``active`` is the one that serves.
        The cursor is a stored position (the default's is 0).
        """
        largest = self.settings.limits.max_page_size
        size = limit if limit is not None else min(DEFAULT_PAGE_SIZE, largest)
        limits.check_value("limit", size, largest)
        after = decode_cursor(cursor) if cursor is not None else None
        collection = self.registry.get(name)
        served = self._profile_for(collection)  # a stored one that decodes, or not
        default = self._default_for(collection) if after is None else None
        shipped: list[CalibratorEntry] = []
        if default is not None:  # first, at position 0
            shipped.append(
                CalibratorEntry(0, default.id, default.method, default.created_at)
            )
        # One more than asked tells whether another page follows.
        entries = shipped + collection.state.calibrator_page(
            size + 1 - len(shipped), after or 0
        )
        page = entries[:size]
        return CalibratorList(
            data=[
                CalibratorSummary(
                    id=e.id,
                    collection=None if e in shipped else name,
                    method=e.method,
                    created_at=e.created_at,
                    active=served is not None and e.id == served.id,
                    default=e in shipped,
                )
                for e in page
            ],
            count=len(page),
            next_cursor=encode_cursor(page[-1].position)
            if len(entries) > size
            else None,
        )

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
        return collection.state.calibrator(calibrator_id)

    async def reliability_png(self, name: str, calibrator_id: str) -> bytes:
        """A calibrator's reliability diagram, drawn once and cached.

        It is drawn from the curve's bins (at most ``BINNING.n_bins``), so a render
        is a fraction of a second of CPU work for the pool.
        """
        profile = self.profile(name, calibrator_id)
        key = (name, profile.id, profile.created_at)
        png = self._png_cache.get(key)
        if png is None:
            png = await self.pool.run(reliability_png, profile)
            self._png_cache[key] = png
            while len(self._png_cache) > PNG_CACHE_ENTRIES:
                self._png_cache.popitem(last=False)
        else:
            self._png_cache.move_to_end(key)
        return png

    def drift_report(self, name: str, calibrator_id: str) -> DriftReport:
        """Whether the queries this calibrator served look like those it was judged on."""
        profile = self.profile(name, calibrator_id)
        settings = self.settings
        report = DriftReport(
            collection=name,
            calibrator=profile.id,
            status="no-reference",
            n_queries=0,
            min_queries=settings.drift_min_queries,
            window=settings.drift_window,
        )
        reference = reference_of(profile)
        if reference is None:
            return report.model_copy(update=_no_reference(name, profile))
        measured = self.drift.measure(name, profile)
        report = report.model_copy(
            update={
                "status": "insufficient-data",
                "n_queries": measured.n_queries,
                "needed": max(0, settings.drift_min_queries - measured.n_queries),
                "since": measured.since,
                "reference_queries": reference.n_queries,
            }
        )
        verdict = measured.verdict
        if verdict is None:
            active = self._profile_for(self.registry.get(name))
            if active is None or active.id != profile.id:
                reason = (
                    "it does not serve this collection: the window follows the "
                    "calibrator that does"
                )
                return report.model_copy(update={"reason": reason})
            return report
        rate = verdict.positive_rate
        return report.model_copy(
            update={
                "status": "drifting" if verdict.drifting else "ok",
                "moved": verdict.moved,
                "features": [
                    FeatureDrift(
                        feature=f.feature,
                        psi=f.psi,
                        level=f.level,
                        critical=f.critical,
                        moved=f.moved,
                    )
                    for f in verdict.features
                ],
                "positive_rate": PositiveRate(
                    predicted=rate.predicted,
                    judged=rate.judged,
                    interval=(rate.low, rate.high),
                    moved=rate.moved,
                ),
            }
        )

    async def activate_calibrator(
        self, name: str, calibrator_id: str
    ) -> CalibratorInfo:
        """Serve a stored calibrator, or the shipped default, from now on."""
        collection = self.registry.get_compatible(name)
        default = self._default_for(collection)
        if default is not None and calibrator_id == default.id:
            await self.pool.run(collection.state.deactivate)
            return self._info(collection, default)
        profile = await self.pool.run(collection.state.activate, calibrator_id)
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
        await self.pool.run(collection.state.delete_calibrator, calibrator_id)

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
        self._check_room(collection)
        model = collection.meta["model"]
        if body.profile.get("model") != model:
            raise InvalidRequestError(
                f"the profile was fitted for embedding model "
                f"{body.profile.get('model')!r}; collection {name!r} uses {model!r}",
                field="profile.model",
            )
        recorded = body.profile.get("model_id")
        if (
            recorded is not None
            and not own_vectors.is_own(collection)
            and recorded != self.embedder.model_id
        ):
            raise InvalidRequestError(
                f"the profile was fitted for model files of identity {recorded!r}; "
                f"the model served as {model!r} has identity "
                f"{self.embedder.model_id!r} (see GET /version)",
                field="profile.model_id",
            )
        imported = await self.pool.run(
            _imported_profile, body.profile, self.settings.limits.max_k
        )
        # Described before it is stored: a profile the API cannot show is refused
        # with nothing stored, never stored and then a 500.
        try:
            info = self._info(collection, imported)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise InvalidRequestError(
                "not a valid calibration profile: its report cannot be described",
                field="profile.report",
            ) from error
        await self.pool.run(
            collection.state.add_calibrator,
            imported,
            activate=body.activate,
            cap=self.settings.limits.max_calibrators_per_collection,
        )
        return info.model_copy(update={"active": body.activate})

    def add_feedback(self, name: str, judgments: list[Judgment]) -> tuple[int, int]:
        """Store judgments for the next fit; returns ``(stored, total)``.

        A collection holds at most ``max_judgments_per_collection``: a request that
        would pass it is refused whole (422, nothing stored). Counting and storing
        are one step under a lock, so concurrent requests cannot both squeeze in.
        Blocking: the router runs it in a worker thread.
        """
        lim = self.settings.limits
        limits.check_count("judgments", judgments, lim.max_judgments_per_fit)
        limits.check_texts("judgments.query", [j.query for j in judgments], lim)
        collection = self.registry.get(name)
        self._check_documents_exist(
            collection, [(j.query, j.document_id) for j in judgments]
        )
        with self._feedback_lock:
            stored = collection.state.judgments_count()
            limits.check_value(
                "judgments",
                stored + len(judgments),
                lim.max_judgments_per_collection,
                rule=f"{len(judgments)} sent plus {stored} stored; "
                "limits.max_judgments_per_collection (delete feedback to make room)",
            )
            total = collection.state.add_judgments(
                [(j.query, j.document_id, j.relevance) for j in judgments]
            )
        return len(judgments), total

    def list_feedback(
        self, name: str, limit: int | None, cursor: str | None
    ) -> FeedbackPage:
        """A page of stored feedback after ``cursor``, oldest first.

        The cursor is that of document listings (``app.services.paging``) over the
        judgments' ``n``, a position later additions and deletions cannot move.
        """
        largest = self.settings.limits.max_page_size
        size = limit if limit is not None else min(DEFAULT_PAGE_SIZE, largest)
        limits.check_value("limit", size, largest)
        after = decode_cursor(cursor) if cursor is not None else 0
        # One more than asked tells whether another page follows.
        rows = self.registry.get(name).state.judgments_page(size + 1, after)
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

    def delete_feedback(
        self, name: str, query: str | None, document_id: str | None = None
    ) -> FeedbackDeleted:
        """Delete stored feedback: all of it, one query's, or one (query, document)'s."""
        if document_id is not None and query is None:
            raise InvalidRequestError(
                "document_id narrows one query's judgments: send query too",
                field="document_id",
            )
        collection = self.registry.get(name)
        return FeedbackDeleted(
            deleted=collection.state.delete_judgments(query, document_id)
        )

    def _check_room(self, collection: CollectionBackend[Profile]) -> None:
        """Refuse (422) a fit or an import at the cap of calibrators, before any work.

        Storing checks again, counting and storing in one step.
        """
        check_calibrator_cap(
            collection.state.calibrators_count(),
            self.settings.limits.max_calibrators_per_collection,
        )

    def _check_documents_exist(
        self, collection: CollectionBackend[Profile], judged: list[tuple[str, str]]
    ) -> None:
        unknown = unknown_documents(collection, judged)
        if unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise InvalidRequestError(
                f"judgments name documents that are not in collection "
                f"{collection.name!r}: {shown}{more}",
                field="judgments",
            )

    def _shipped_prior(
        self, collection: CollectionBackend[Profile], *, lists: bool = False
    ) -> CrossDomainPrior | None:
        """The cross-domain prior of the shipped default profile (for few-label fits).

        On a collection of the client's own vectors, the model-agnostic one's; for a
        fit mostly of judged lists (``lists``), the default for external lists'.
        """
        external = self.context.rerank_profile
        if lists and external is not None and external.prior is not None:
            return external.prior
        if own_vectors.is_own(collection):
            agnostic = self._default_for(collection)
            return None if agnostic is None else agnostic.prior
        default = self.default_profile
        if default is None or default.model != self.embedder.model_name:
            return None
        return default.prior

    def _info(
        self,
        collection: CollectionBackend[Profile],
        profile: Profile,
        *,
        inputs: FitJudgments | None = None,
    ) -> CalibratorInfo:
        active = self._profile_for(collection)
        report = profile.report
        abstain = None if report.abstain is None else to_jsonable(report.abstain)
        selection = report.selection
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
            selection=None
            if selection is None
            else CalibratorSelection.model_validate(to_jsonable(selection)),
            report=report.to_jsonable(),
            dropped_judgments=None if inputs is None else inputs.dropped,
            judgments=inputs,
        )


def _no_reference(name: str, profile: Profile) -> dict[str, Any]:
    """Why a calibrator has no judged queries to compare with, and what to do."""
    if profile.default:
        return {
            "reason": "the shipped default was fitted on no judged queries of this "
            "collection, so there is nothing to compare its queries with",
            "next_step": judging_step(name),
        }
    return {
        "reason": "fitted before drift references were recorded: refit it (the "
        "stored feedback is reused) to get one"
    }


def _imported_profile(data: dict[str, Any], max_rank: int) -> Profile:
    """Decode an exported profile and give it a new id in this collection.

    The profile is decoded by its schema (``Profile.from_json``) and must score a
    grid over the feature space with finite probabilities in [0, 1]
    (``trial_scores``); anything else is a 422 naming the field and the rule, and
    nothing is stored: stored, it would break every later search.
    """
    try:
        profile = Profile.from_json(data)
        trial_scores(profile, max_rank=max_rank)
    except UnsupportedFormatError as error:
        raise InvalidRequestError(
            f"not a valid calibration profile: {error}",
            field="profile" if error.field is None else f"profile.{error.field}",
        ) from error
    return replace(
        profile, id=uuid.uuid4().hex[:12], created_at=time.time(), default=False
    )


NORM_SAMPLE_MIN = 5
"""Documents a norm reference needs (``calibration.NormReference``): a collection
with fewer (a namespace of rerank requests) borrows its judged lists' documents."""


def check_lists(body: FitRequest, lim: Limits) -> None:
    """The limits of a fit's judged lists: each as a rerank request's (422 naming it)."""
    for i, judged in enumerate(body.lists):
        limits.check_value(
            f"lists.{i}.query", len(judged.query), lim.max_text_chars, rule="characters"
        )
        try:
            check_documents(judged.documents, lim)
        except InvalidRequestError as error:
            raise type(error)(
                f"lists.{i}.{error}", field=f"lists.{i}.{error.field}"
            ) from None


def unknown_documents(
    collection: CollectionBackend[Profile], judged: list[tuple[str, str]]
) -> list[str]:
    """Ids of ``(query, document id)`` judgments naming nothing the collection knows.

    A document is known when the collection holds it, or when the query's logged
    rerank request (``app.services.rerank``) had it.
    """
    missing = set(collection.missing([d for _, d in judged]))
    if not missing:
        return []
    queries = sorted({q for q, d in judged if d in missing})
    listed = {
        (q, str(doc["id"]))
        for q, (documents, _) in collection.state.rerank_lists(queries).items()
        for doc in json.loads(documents)
    }
    return list(
        dict.fromkeys(d for q, d in judged if d in missing and (q, d) not in listed)
    )


def logged_list(query: str, logged: str, judged: dict[str, int]) -> JudgedList:
    """A logged rerank request with its stored judgments, as a judged list."""
    return JudgedList(
        query=query,
        documents=[
            JudgedDocument(
                text=str(doc["text"]),
                id=str(doc["id"]),
                score=doc.get("score"),
                relevance=judged.get(str(doc["id"])),
            )
            for doc in json.loads(logged)
        ],
    )
